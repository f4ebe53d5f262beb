//! Command output: reading a pipe in bounded chunks and handing them to a sink that enforces the
//! per-stream cap (bytes past the cap are read and discarded, never buffered), plus the text/base64
//! encodings of output for JSON.

use std::sync::{Arc, Mutex};

use base64::Engine;
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

use orchard_api::agent::ExecEvent;

use super::budget::{Charge, OutputBudget};
use super::request::OutputEncoding;

/// First read reservation; doubled while reads fill it, up to `MAX_READ`.
const FIRST_READ: usize = 4 * 1024;
/// Largest single read (the default pipe buffer is 64 KiB).
const MAX_READ: usize = 64 * 1024;

/// The head of one output stream: at most `cap` bytes, and only as many as the agent-wide output
/// budget grants (see `budget`). Output past either limit is dropped and the stream marked truncated;
/// once truncated nothing more is kept, so the captured bytes are always a prefix of the output.
#[derive(Debug, Default)]
pub struct CapturedOutput {
    bytes: Vec<u8>,
    cap: usize,
    truncated: bool,
    charge: Charge,
}

impl CapturedOutput {
    /// A buffer limited by `cap` only.
    pub fn new(cap: usize) -> Self {
        CapturedOutput {
            bytes: Vec::new(),
            cap,
            truncated: false,
            charge: Charge::default(),
        }
    }

    /// A buffer limited by `cap` and charged to `budget`.
    pub fn with_budget(cap: usize, budget: &Arc<OutputBudget>) -> Self {
        CapturedOutput {
            charge: Charge::new(Arc::clone(budget)),
            ..CapturedOutput::new(cap)
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        if self.truncated {
            return;
        }
        let room = self.cap.saturating_sub(self.bytes.len());
        let wanted = chunk.len().min(room);
        let granted = self.charge.grow(wanted);
        self.bytes.extend_from_slice(&chunk[..granted]);
        if granted < chunk.len() {
            self.truncated = true;
        }
    }

    /// Takes over the budget charge of the captured bytes, so it can be held until the response that
    /// carries them has been built (the buffer itself is then charged nothing).
    pub fn take_charge(&mut self) -> Charge {
        std::mem::take(&mut self.charge)
    }

    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// The bytes captured so far.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Encodes the captured bytes, consuming them (no copy for valid UTF-8 text).
    pub fn into_encoded(self, encoding: OutputEncoding) -> EncodedOutput {
        let truncated = self.truncated;
        match encoding {
            OutputEncoding::Base64 => EncodedOutput {
                data: base64::engine::general_purpose::STANDARD.encode(&self.bytes),
                truncated,
                lossy: false,
            },
            OutputEncoding::Text => {
                let mut bytes = self.bytes;
                if truncated {
                    let keep = without_cut_tail(&bytes).len();
                    bytes.truncate(keep);
                }
                match String::from_utf8(bytes) {
                    Ok(data) => EncodedOutput {
                        data,
                        truncated,
                        lossy: false,
                    },
                    Err(error) => EncodedOutput {
                        data: String::from_utf8_lossy(error.as_bytes()).into_owned(),
                        truncated,
                        lossy: true,
                    },
                }
            }
        }
    }

    /// Encodes a copy of the captured bytes (for output that is still growing).
    pub fn encoded(&self, encoding: OutputEncoding) -> EncodedOutput {
        CapturedOutput {
            bytes: self.bytes.clone(),
            cap: self.cap,
            truncated: self.truncated,
            charge: Charge::default(),
        }
        .into_encoded(encoding)
    }
}

/// Output as it goes into JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncodedOutput {
    pub data: String,
    pub truncated: bool,
    /// Text encoding replaced invalid UTF-8 with U+FFFD.
    pub lossy: bool,
}

/// Drops a UTF-8 sequence that the output cap cut in half, so truncation alone never looks lossy.
fn without_cut_tail(bytes: &[u8]) -> &[u8] {
    let len = bytes.len();
    for index in (len.saturating_sub(3)..len).rev() {
        let byte = bytes[index];
        if byte < 0x80 {
            break;
        }
        let needed = match byte {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            0x80..=0xBF => continue, // continuation byte: look further back for the lead
            _ => break,              // never valid in UTF-8: bad output, not a cut
        };
        if index + needed > len {
            return &bytes[..index];
        }
        break;
    }
    bytes
}

/// Decodes UTF-8 that arrives in arbitrary chunks: a sequence split across chunks is held back until its
/// end arrives; invalid bytes become U+FFFD and set `lossy`.
#[derive(Debug, Default)]
pub struct Utf8StreamDecoder {
    pending: Vec<u8>,
    pub lossy: bool,
}

impl Utf8StreamDecoder {
    pub fn decode(&mut self, chunk: &[u8]) -> String {
        let joined;
        let input: &[u8] = if self.pending.is_empty() {
            chunk
        } else {
            self.pending.extend_from_slice(chunk);
            joined = std::mem::take(&mut self.pending);
            &joined
        };
        let mut decoded = String::with_capacity(input.len());
        let mut rest = input;
        loop {
            match std::str::from_utf8(rest) {
                Ok(valid) => {
                    decoded.push_str(valid);
                    break;
                }
                Err(error) => {
                    let (valid, after) = rest.split_at(error.valid_up_to());
                    decoded.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match error.error_len() {
                        Some(invalid) => {
                            decoded.push('\u{FFFD}');
                            self.lossy = true;
                            rest = &after[invalid..];
                        }
                        None => {
                            self.pending = after.to_vec();
                            break;
                        }
                    }
                }
            }
        }
        decoded
    }

    /// Flushes an incomplete trailing sequence (as U+FFFD) at the end of the stream.
    pub fn finish(&mut self) -> String {
        if self.pending.is_empty() {
            return String::new();
        }
        self.pending.clear();
        self.lossy = true;
        "\u{FFFD}".to_string()
    }
}

/// Which stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamName {
    Stdout,
    Stderr,
}

/// Streams output chunks as NDJSON events `{"type":"stdout","data":"..."}` into a response body.
#[derive(Debug)]
pub struct EventSink {
    name: StreamName,
    encoding: OutputEncoding,
    events: mpsc::Sender<Bytes>,
    decoder: Utf8StreamDecoder,
    remaining: usize,
    truncated: bool,
}

impl EventSink {
    pub fn new(
        name: StreamName,
        encoding: OutputEncoding,
        cap: usize,
        events: mpsc::Sender<Bytes>,
    ) -> Self {
        EventSink {
            name,
            encoding,
            events,
            decoder: Utf8StreamDecoder::default(),
            remaining: cap,
            truncated: false,
        }
    }

    async fn send_data(&mut self, data: &str) {
        if data.is_empty() {
            return;
        }
        let data = data.to_string();
        let event = match self.name {
            StreamName::Stdout => ExecEvent::Stdout { data },
            StreamName::Stderr => ExecEvent::Stderr { data },
        };
        if let Ok(mut line) = serde_json::to_vec(&event) {
            line.push(b'\n');
            // A closed receiver means the client is gone; the request future is about to be dropped.
            let _ = self.events.send(Bytes::from(line)).await;
        }
    }

    async fn accept(&mut self, chunk: &[u8]) {
        let kept = chunk.len().min(self.remaining);
        if kept < chunk.len() {
            self.truncated = true;
        }
        if kept == 0 {
            return;
        }
        self.remaining -= kept;
        let data = match self.encoding {
            OutputEncoding::Text => self.decoder.decode(&chunk[..kept]),
            OutputEncoding::Base64 => {
                base64::engine::general_purpose::STANDARD.encode(&chunk[..kept])
            }
        };
        self.send_data(&data).await;
    }

    /// Sends what the decoder still holds; call once after the stream ended.
    pub async fn finish(&mut self) {
        if self.encoding != OutputEncoding::Text {
            return;
        }
        if self.truncated && self.remaining == 0 {
            // A sequence cut by the cap is truncation, not bad output: drop it without the lossy flag.
            let was_lossy = self.decoder.lossy;
            let _ = self.decoder.finish();
            self.decoder.lossy = was_lossy;
        } else {
            let rest = self.decoder.finish();
            self.send_data(&rest).await;
        }
    }

    pub fn truncated(&self) -> bool {
        self.truncated
    }

    pub fn lossy(&self) -> bool {
        self.decoder.lossy
    }
}

/// Where a pump delivers output.
#[derive(Debug)]
pub enum OutputSink {
    /// Kept for one JSON response.
    Buffer(CapturedOutput),
    /// Kept in a buffer that status requests read while the command runs (background processes).
    Shared(Arc<Mutex<CapturedOutput>>),
    /// Sent as NDJSON events.
    Events(EventSink),
}

impl OutputSink {
    async fn accept(&mut self, chunk: &[u8]) {
        match self {
            OutputSink::Buffer(output) => output.push(chunk),
            OutputSink::Shared(output) => output
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push(chunk),
            OutputSink::Events(events) => events.accept(chunk).await,
        }
    }
}

/// Reads `pipe` to its end, delivering every chunk to `sink`. Memory stays bounded by one read buffer
/// however much the command writes.
pub async fn pump(mut pipe: impl AsyncRead + Unpin, sink: &mut OutputSink) {
    let mut buffer = BytesMut::new();
    let mut reservation = FIRST_READ;
    loop {
        buffer.reserve(reservation);
        match pipe.read_buf(&mut buffer).await {
            Ok(0) => break,
            Ok(read) => {
                if read >= reservation && reservation < MAX_READ {
                    reservation *= 2;
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
        let chunk = buffer.split();
        sink.accept(&chunk).await;
        // Dropping `chunk` lets `reserve` reuse the same allocation on the next round.
        drop(chunk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_is_limited_by_the_shared_budget() {
        let budget = OutputBudget::new(6);
        let mut first = CapturedOutput::with_budget(5, &budget);
        first.push(b"abcd");
        let mut second = CapturedOutput::with_budget(5, &budget);
        second.push(b"wxyz");
        assert!(!first.truncated());
        assert!(second.truncated(), "only 2 bytes were left in the budget");
        // Once truncated, later output is not kept even when the budget has room again: the captured
        // bytes stay a prefix of the output.
        drop(first);
        second.push(b"!");
        assert_eq!(budget.used(), 2);
        let charge = second.take_charge();
        let encoded = second.into_encoded(OutputEncoding::Text);
        assert_eq!(
            encoded,
            EncodedOutput {
                data: "wx".into(),
                truncated: true,
                lossy: false
            }
        );
        assert_eq!(budget.used(), 2, "held until the response is built");
        drop(charge);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn capture_caps_and_flags() {
        let mut output = CapturedOutput::new(5);
        output.push(b"abc");
        output.push(b"defg");
        assert!(output.truncated());
        let encoded = output.into_encoded(OutputEncoding::Text);
        assert_eq!(
            encoded,
            EncodedOutput {
                data: "abcde".into(),
                truncated: true,
                lossy: false
            }
        );
    }

    #[test]
    fn text_is_lossy_only_for_invalid_bytes() {
        let mut output = CapturedOutput::new(100);
        output.push(b"ok \xff\xfe end");
        let encoded = output.into_encoded(OutputEncoding::Text);
        assert!(encoded.lossy);
        assert_eq!(encoded.data, "ok \u{FFFD}\u{FFFD} end");

        // "é" is C3 A9; a cap of 2 cuts it after C3: truncated, not lossy.
        let mut output = CapturedOutput::new(2);
        output.push("aé".as_bytes());
        let encoded = output.into_encoded(OutputEncoding::Text);
        assert_eq!(
            encoded,
            EncodedOutput {
                data: "a".into(),
                truncated: true,
                lossy: false
            }
        );
    }

    #[test]
    fn base64_keeps_exact_bytes() {
        let mut output = CapturedOutput::new(100);
        output.push(b"\x00\xff");
        assert_eq!(output.encoded(OutputEncoding::Base64).data, "AP8=");
    }

    #[test]
    fn stream_decoder_joins_split_sequences() {
        let mut decoder = Utf8StreamDecoder::default();
        let bytes = "héllo €".as_bytes();
        let mut text = String::new();
        for byte in bytes {
            text.push_str(&decoder.decode(std::slice::from_ref(byte)));
        }
        text.push_str(&decoder.finish());
        assert_eq!(text, "héllo €");
        assert!(!decoder.lossy);

        let mut decoder = Utf8StreamDecoder::default();
        assert_eq!(decoder.decode(b"a\xffb\xe2\x82"), "a\u{FFFD}b");
        assert_eq!(decoder.finish(), "\u{FFFD}");
        assert!(decoder.lossy);
    }

    #[test]
    fn cut_tail_detection() {
        assert_eq!(without_cut_tail("a€".as_bytes()), "a€".as_bytes());
        assert_eq!(without_cut_tail(&"a€".as_bytes()[..3]), b"a");
        assert_eq!(without_cut_tail(b"abc"), b"abc");
        assert_eq!(without_cut_tail(b"ab\xff"), b"ab\xff");
    }

    #[tokio::test]
    async fn pump_discards_past_the_cap() {
        let data = vec![b'x'; 1_000_000];
        let mut sink = OutputSink::Buffer(CapturedOutput::new(10));
        pump(&data[..], &mut sink).await;
        let OutputSink::Buffer(output) = sink else {
            unreachable!()
        };
        assert!(output.truncated());
        assert_eq!(output.into_encoded(OutputEncoding::Text).data, "xxxxxxxxxx");
    }

    #[tokio::test]
    async fn events_are_ndjson_lines() {
        let (sender, mut receiver) = mpsc::channel(8);
        let mut sink = OutputSink::Events(EventSink::new(
            StreamName::Stderr,
            OutputEncoding::Text,
            3,
            sender,
        ));
        pump(&b"abcdef"[..], &mut sink).await;
        let OutputSink::Events(mut events) = sink else {
            unreachable!()
        };
        events.finish().await;
        assert!(events.truncated());
        drop(events);
        let line = receiver.recv().await.unwrap();
        assert_eq!(&line[..], b"{\"type\":\"stderr\",\"data\":\"abc\"}\n");
        assert!(receiver.recv().await.is_none());
    }
}
