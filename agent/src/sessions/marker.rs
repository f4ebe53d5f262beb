//! The end marker of a run: after each command the shell prints `<marker>:<$?>\n`, with a marker made
//! fresh for every run, and [`MarkerScanner`] finds that line in the shell's output stream (which
//! arrives in arbitrary chunks), strips it, and reports the status. Pure: no I/O.

/// Fixed start of every marker.
const MARKER_PREFIX: &str = "__orchard_end_";
/// Most digits (and sign) of a status after the marker before the line is taken as not a marker.
const MAX_STATUS_LENGTH: usize = 12;

/// A run's end marker, in the two halves the shell prints side by side (`printf '%s%s'`), so that
/// the whole marker never appears in the command line itself (e.g. echoed by `set -x`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndMarker {
    head: String,
    tail: String,
}

impl EndMarker {
    /// A marker around the random `token` (hex).
    pub fn new(token: &str) -> EndMarker {
        EndMarker {
            head: MARKER_PREFIX.to_string(),
            tail: format!("{token}__"),
        }
    }

    /// The marker as it appears in the output, followed by its `:`.
    pub fn needle(&self) -> Vec<u8> {
        format!("{}{}:", self.head, self.tail).into_bytes()
    }

    /// The line written to the shell to run `command` and print the marker after it: the command
    /// runs through `__orchard_run` (see `shell`) so an interrupt can abort it as a whole; the SIGINT
    /// trap is set again first, in case an earlier command changed it.
    pub fn run_line(&self, command: &str) -> String {
        format!(
            "trap 'return 130' INT; __orchard_command={}; __orchard_run; printf '%s%s:%s\\n' '{}' '{}' \"$?\"\n",
            single_quoted(command),
            self.head,
            self.tail
        )
    }

    /// A line that only prints the marker (to find the end of whatever the shell still does).
    pub fn sync_line(&self) -> String {
        format!(
            "printf '%s%s:%s\\n' '{}' '{}' \"$?\"\n",
            self.head, self.tail
        )
    }
}

/// `text` as one shell word: in single quotes, each `'` written as `'\''`.
pub fn single_quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

/// What a chunk of shell output held.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Scanned {
    /// Output before the marker (or all of it without one).
    pub output: Vec<u8>,
    /// The status the marker line carried, when it was complete in this chunk.
    pub status: Option<i32>,
    /// Output after the marker line (the next command's, or background jobs').
    pub after: Vec<u8>,
}

/// Finds the expected marker line in output chunks, holding back only bytes that may be the start of
/// it until the next chunk decides.
#[derive(Debug, Default)]
pub struct MarkerScanner {
    needle: Option<Vec<u8>>,
    held: Vec<u8>,
}

impl MarkerScanner {
    /// Starts looking for `marker`; bytes held back for an earlier one are dropped.
    pub fn expect(&mut self, marker: &EndMarker) {
        self.needle = Some(marker.needle());
        self.held.clear();
    }

    /// Stops looking; returns the bytes held back, which are output after all.
    pub fn stop(&mut self) -> Vec<u8> {
        self.needle = None;
        std::mem::take(&mut self.held)
    }

    /// Whether a marker is expected.
    pub fn expecting(&self) -> bool {
        self.needle.is_some()
    }

    /// Bytes held back as a possible marker start.
    pub fn held(&self) -> &[u8] {
        &self.held
    }

    /// Scans the next chunk of output.
    pub fn push(&mut self, chunk: &[u8]) -> Scanned {
        let Some(needle) = self.needle.clone() else {
            return Scanned {
                output: chunk.to_vec(),
                ..Scanned::default()
            };
        };
        let mut window = std::mem::take(&mut self.held);
        window.extend_from_slice(chunk);
        let mut output = Vec::new();
        let mut from = 0;
        while let Some(found) = find(&window[from..], &needle).map(|at| at + from) {
            let line_start = found + needle.len();
            match parse_status(&window[line_start..]) {
                Status::Complete { status, length } => {
                    output.extend_from_slice(&window[from..found]);
                    self.needle = None;
                    return Scanned {
                        output,
                        status: Some(status),
                        after: window[line_start + length..].to_vec(),
                    };
                }
                Status::Incomplete => {
                    output.extend_from_slice(&window[from..found]);
                    self.held = window[found..].to_vec();
                    return Scanned {
                        output,
                        ..Scanned::default()
                    };
                }
                // Not a marker line after all: output, and look further on.
                Status::Invalid => {
                    output.extend_from_slice(&window[from..line_start]);
                    from = line_start;
                }
            }
        }
        let rest = &window[from..];
        let keep = partial_prefix_length(rest, &needle);
        output.extend_from_slice(&rest[..rest.len() - keep]);
        self.held = rest[rest.len() - keep..].to_vec();
        Scanned {
            output,
            ..Scanned::default()
        }
    }
}

enum Status {
    /// `<digits>\n`: the status and the bytes it took (newline included).
    Complete {
        status: i32,
        length: usize,
    },
    /// Digits so far, no newline yet.
    Incomplete,
    Invalid,
}

fn parse_status(bytes: &[u8]) -> Status {
    let Some(newline) = bytes.iter().position(|byte| *byte == b'\n') else {
        let valid_so_far = bytes.len() <= MAX_STATUS_LENGTH
            && bytes
                .iter()
                .enumerate()
                .all(|(index, byte)| byte.is_ascii_digit() || (index == 0 && *byte == b'-'));
        return if valid_so_far {
            Status::Incomplete
        } else {
            Status::Invalid
        };
    };
    std::str::from_utf8(&bytes[..newline])
        .ok()
        .filter(|digits| !digits.is_empty() && digits.len() <= MAX_STATUS_LENGTH)
        .and_then(|digits| digits.parse::<i32>().ok())
        .map_or(Status::Invalid, |status| Status::Complete {
            status,
            length: newline + 1,
        })
}

/// Where `needle` first occurs in `haystack`.
pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// Length of the longest end of `bytes` that is a proper start of `needle`.
fn partial_prefix_length(bytes: &[u8], needle: &[u8]) -> usize {
    let longest = bytes.len().min(needle.len().saturating_sub(1));
    (1..=longest)
        .rev()
        .find(|length| bytes[bytes.len() - length..] == needle[..*length])
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marker() -> EndMarker {
        EndMarker::new("abc")
    }

    #[test]
    fn run_lines_quote_the_command_and_split_the_marker() {
        let line = marker().run_line("echo 'hi'");
        assert_eq!(
            line,
            "trap 'return 130' INT; __orchard_command='echo '\\''hi'\\'''; __orchard_run; printf '%s%s:%s\\n' '__orchard_end_' 'abc__' \"$?\"\n"
        );
        assert!(!line.contains("__orchard_end_abc__"), "never whole");
        assert_eq!(single_quoted("a\nb"), "'a\nb'");
    }

    #[test]
    fn a_marker_in_one_chunk_ends_the_output() {
        let mut scanner = MarkerScanner::default();
        scanner.expect(&marker());
        let scanned = scanner.push(b"hello\n__orchard_end_abc__:0\nlater");
        assert_eq!(
            scanned,
            Scanned {
                output: b"hello\n".to_vec(),
                status: Some(0),
                after: b"later".to_vec()
            }
        );
        assert!(!scanner.expecting());
        assert_eq!(scanner.push(b"x").output, b"x");
    }

    #[test]
    fn output_without_a_final_newline_keeps_its_bytes() {
        let mut scanner = MarkerScanner::default();
        scanner.expect(&marker());
        let scanned = scanner.push(b"no newline__orchard_end_abc__:130\n");
        assert_eq!(scanned.output, b"no newline");
        assert_eq!(scanned.status, Some(130));
    }

    #[test]
    fn a_marker_split_anywhere_is_found() {
        let whole = b"out\n__orchard_end_abc__:42\ntail".to_vec();
        for cut in 0..whole.len() {
            let mut scanner = MarkerScanner::default();
            scanner.expect(&marker());
            let first = scanner.push(&whole[..cut]);
            let second = scanner.push(&whole[cut..]);
            let mut output = first.output.clone();
            let mut after = first.after.clone();
            // Once the marker was seen, the scanner passes everything on: it is output after it.
            if first.status.is_some() {
                after.extend_from_slice(&second.output);
            } else {
                output.extend_from_slice(&second.output);
            }
            let status = first.status.or(second.status);
            after.extend_from_slice(&second.after);
            assert_eq!(
                (output.as_slice(), status, after.as_slice()),
                (&b"out\n"[..], Some(42), &b"tail"[..]),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn only_possible_marker_starts_are_held_back() {
        let mut scanner = MarkerScanner::default();
        scanner.expect(&marker());
        assert_eq!(scanner.push(b"prompt> ").output, b"prompt> ");
        assert!(scanner.held().is_empty());
        assert_eq!(scanner.push(b"a__orch").output, b"a");
        assert_eq!(scanner.held(), b"__orch");
        assert_eq!(scanner.push(b"estra").output, b"__orchestra");
        assert_eq!(scanner.stop(), b"");
    }

    #[test]
    fn echoed_command_lines_and_other_markers_are_output() {
        let mut scanner = MarkerScanner::default();
        scanner.expect(&marker());
        let text = b"+ printf %s%s:%s\\n __orchard_end_ abc__ 0\n__orchard_end_zzz__:0\n__orchard_end_abc__:x\n";
        let scanned = scanner.push(text);
        assert_eq!(scanned.output, text.to_vec());
        assert_eq!(scanned.status, None);
        assert!(scanner.held().is_empty());
        let scanned = scanner.push(b"__orchard_end_abc__:-1\n");
        assert_eq!(scanned.status, Some(-1));
    }

    #[test]
    fn without_a_marker_expected_everything_passes() {
        let mut scanner = MarkerScanner::default();
        let scanned = scanner.push(b"__orchard_end_abc__:0\n");
        assert_eq!(scanned.output, b"__orchard_end_abc__:0\n");
        assert_eq!(scanned.status, None);
        assert_eq!(find(b"abc", b""), Some(0));
        assert_eq!(find(b"abc", b"c"), Some(2));
        assert_eq!(find(b"ab", b"abc"), None);
    }
}
