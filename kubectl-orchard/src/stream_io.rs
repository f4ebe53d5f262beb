//! Bridges between blocking readers and writers (the tar crate's) and async byte streams (HTTP
//! bodies): a [`ChannelWriter`] turns writes into a stream of chunks, a [`ChannelReader`] reads a
//! stream of chunks. Both are used from `spawn_blocking` threads only.

use std::io::{self, Read, Write};

use bytes::Bytes;
use tokio::sync::mpsc;

/// Chunks of this size go to the channel.
const CHUNK: usize = 64 * 1024;

/// A blocking writer whose bytes arrive as chunks on a channel.
pub struct ChannelWriter {
    sender: mpsc::Sender<io::Result<Bytes>>,
    buffer: Vec<u8>,
}

impl ChannelWriter {
    /// A writer and the receiving end of its chunks (at most `depth` chunks in flight).
    pub fn new(depth: usize) -> (Self, mpsc::Receiver<io::Result<Bytes>>) {
        let (sender, receiver) = mpsc::channel(depth.max(1));
        (
            Self {
                sender,
                buffer: Vec::with_capacity(CHUNK),
            },
            receiver,
        )
    }

    /// A handle that can end the stream with an error while the writer itself is owned by someone
    /// else (a tar builder, which writes its end-of-archive blocks when dropped).
    pub fn failure_handle(&self) -> FailureHandle {
        FailureHandle {
            sender: self.sender.clone(),
        }
    }

    fn send_buffer(&mut self) -> io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(
            &mut self.buffer,
            Vec::with_capacity(CHUNK),
        ));
        self.sender
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the upload stopped"))
    }
}

/// Ends a [`ChannelWriter`]'s stream with an error.
pub struct FailureHandle {
    sender: mpsc::Sender<io::Result<Bytes>>,
}

impl FailureHandle {
    /// Sends `error` to the reader: it gets it before anything written afterwards.
    pub fn fail(self, error: io::Error) {
        // The receiver may be gone: then nobody needs the error.
        let _ = self.sender.blocking_send(Err(error));
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buffer.extend_from_slice(data);
        if self.buffer.len() >= CHUNK {
            self.send_buffer()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send_buffer()
    }
}

impl Drop for ChannelWriter {
    fn drop(&mut self) {
        let _ = self.send_buffer();
    }
}

/// A blocking reader of the chunks arriving on a channel (end of stream when the sender is gone).
pub struct ChannelReader {
    receiver: mpsc::Receiver<io::Result<Bytes>>,
    current: Bytes,
}

impl ChannelReader {
    /// A reader of `receiver`'s chunks.
    pub fn new(receiver: mpsc::Receiver<io::Result<Bytes>>) -> Self {
        Self {
            receiver,
            current: Bytes::new(),
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.receiver.blocking_recv() {
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(error)) => return Err(error),
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.current.len());
        out[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_pass_through_in_order() {
        let (mut writer, receiver) = ChannelWriter::new(4);
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let expected = data.clone();
        let reader_thread = std::thread::spawn(move || {
            let mut read = Vec::new();
            ChannelReader::new(receiver).read_to_end(&mut read).unwrap();
            read
        });
        for piece in data.chunks(1000) {
            writer.write_all(piece).unwrap();
        }
        drop(writer);
        assert_eq!(reader_thread.join().unwrap(), expected);
    }

    #[test]
    fn errors_reach_the_reader() {
        let (mut writer, receiver) = ChannelWriter::new(4);
        writer.write_all(b"abc").unwrap();
        writer.flush().unwrap();
        writer.failure_handle().fail(io::Error::other("disk gone"));
        writer.write_all(b"ignored").unwrap();
        drop(writer);
        let mut read = Vec::new();
        let error = ChannelReader::new(receiver)
            .read_to_end(&mut read)
            .unwrap_err();
        assert_eq!(error.to_string(), "disk gone");
        assert_eq!(read, b"abc");
    }
}
