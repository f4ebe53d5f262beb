//! The output of a session's shell as the agent keeps it: the current segment (output since the
//! current run started, or since the last run ended), capped and charged to the agent-wide output
//! budget like exec output (`CapturedOutput`), the position up to which `read` has returned it, the
//! scanner looking for the current run's end marker, and the segment of a run that has ended, waiting
//! for its run to collect it.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::marker::{EndMarker, MarkerScanner, find};
use crate::exec::budget::OutputBudget;
use crate::exec::output::CapturedOutput;

/// A run's output and the status its end marker carried.
#[derive(Debug)]
pub struct FinishedRun {
    pub output: CapturedOutput,
    pub status: i32,
}

/// What `read` returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadOutput {
    pub bytes: Vec<u8>,
    pub matched: bool,
    pub truncated: bool,
}

#[derive(Debug)]
struct OutputState {
    segment: CapturedOutput,
    /// How much of `segment` `read` has returned.
    cursor: usize,
    scanner: MarkerScanner,
    finished: Option<FinishedRun>,
    /// The shell's output pipe has closed: no more output will come.
    closed: bool,
    cap: usize,
    budget: Option<Arc<OutputBudget>>,
}

impl OutputState {
    fn fresh_segment(&self) -> CapturedOutput {
        match &self.budget {
            Some(budget) => CapturedOutput::with_budget(self.cap, budget),
            None => CapturedOutput::new(self.cap),
        }
    }
}

/// Output shared by the task reading the shell's pipe and the session's requests.
#[derive(Debug)]
pub struct ShellOutput {
    state: Mutex<OutputState>,
    changed: Notify,
}

impl ShellOutput {
    /// Output kept up to `cap` bytes per segment, charged to `budget` when given.
    pub fn new(cap: usize, budget: Option<Arc<OutputBudget>>) -> Arc<ShellOutput> {
        let segment = match &budget {
            Some(budget) => CapturedOutput::with_budget(cap, budget),
            None => CapturedOutput::new(cap),
        };
        Arc::new(ShellOutput {
            state: Mutex::new(OutputState {
                segment,
                cursor: 0,
                scanner: MarkerScanner::default(),
                finished: None,
                closed: false,
                cap,
                budget,
            }),
            changed: Notify::new(),
        })
    }

    fn state(&self) -> MutexGuard<'_, OutputState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes a chunk the shell wrote.
    pub fn accept(&self, chunk: &[u8]) {
        {
            let mut state = self.state();
            let scanned = state.scanner.push(chunk);
            state.segment.push(&scanned.output);
            if let Some(status) = scanned.status {
                let next = state.fresh_segment();
                let output = std::mem::replace(&mut state.segment, next);
                // What no read returned stays readable after the run ends (until the next run
                // starts), so an expect-style read is the same whether it comes just before or just
                // after the run's end; the run still answers its whole output.
                let unread = &output.bytes()[state.cursor.min(output.bytes().len())..];
                let unread = unread.to_vec();
                state.segment.push(&unread);
                state.cursor = 0;
                state.finished = Some(FinishedRun { output, status });
                state.segment.push(&scanned.after);
            }
        }
        self.changed.notify_waiters();
    }

    /// The output pipe closed (the shell and everything holding the pipe are gone).
    pub fn close(&self) {
        {
            let mut state = self.state();
            let held = state.scanner.stop();
            state.segment.push(&held);
            state.closed = true;
        }
        self.changed.notify_waiters();
    }

    pub fn is_closed(&self) -> bool {
        self.state().closed
    }

    /// Wakes everyone waiting for a change.
    pub fn notify(&self) {
        self.changed.notify_waiters();
    }

    /// A future that completes at the next change (create it before checking, then await it).
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }

    /// A run starts: output from now on is its own (what was not read is dropped), ended by `marker`.
    pub fn begin_run(&self, marker: &EndMarker) {
        let mut state = self.state();
        state.segment = state.fresh_segment();
        state.cursor = 0;
        state.finished = None;
        state.scanner.expect(marker);
    }

    /// The ended run's output and status, once its marker was seen.
    pub fn take_finished(&self) -> Option<FinishedRun> {
        self.state().finished.take()
    }

    /// Stops waiting for the marker and takes the output so far (a run given up on).
    pub fn take_segment(&self) -> CapturedOutput {
        let mut state = self.state();
        let held = state.scanner.stop();
        state.segment.push(&held);
        let next = state.fresh_segment();
        state.cursor = 0;
        std::mem::replace(&mut state.segment, next)
    }

    /// Output not read yet, up to and including the first `until` in it; `None` when `until` is given
    /// and not there yet. Bytes held back as a possible marker start count as output here.
    pub fn read(&self, until: Option<&[u8]>) -> Option<ReadOutput> {
        let mut state = self.state();
        let start = state.cursor.min(state.segment.bytes().len());
        let mut unread = state.segment.bytes()[start..].to_vec();
        let visible = unread.len();
        unread.extend_from_slice(state.scanner.held());
        let (end, matched) = match until {
            None => (visible, false),
            Some(until) => match find(&unread, until) {
                Some(at) => (at + until.len(), true),
                None => return None,
            },
        };
        unread.truncate(end);
        state.cursor = start + end;
        Some(ReadOutput {
            bytes: unread,
            matched,
            truncated: state.segment.truncated(),
        })
    }

    /// Everything not read yet (`read` that gave up waiting).
    pub fn read_all(&self) -> ReadOutput {
        self.read(None).unwrap_or(ReadOutput {
            bytes: Vec::new(),
            matched: false,
            truncated: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_collects_its_output_up_to_the_marker() {
        let output = ShellOutput::new(1024, None);
        output.accept(b"before the run\n");
        let marker = EndMarker::new("t1");
        output.begin_run(&marker);
        output.accept(b"one\ntwo\n__orchard_end_t1__:3\nbackground\n");
        let finished = output.take_finished().unwrap();
        assert_eq!(finished.status, 3);
        assert_eq!(finished.output.bytes(), b"one\ntwo\n");
        // The run's output no read returned, then what came after the run.
        assert_eq!(output.read_all().bytes, b"one\ntwo\nbackground\n");
        assert!(output.take_finished().is_none());
    }

    #[test]
    fn reads_return_each_byte_once_up_to_the_literal() {
        let output = ShellOutput::new(1024, None);
        output.begin_run(&EndMarker::new("t2"));
        output.accept(b"name? ");
        assert_eq!(output.read(Some(b"age?")), None);
        let read = output.read(Some(b"name? ")).unwrap();
        assert_eq!(
            (read.bytes.as_slice(), read.matched),
            (&b"name? "[..], true)
        );
        output.accept(b"got bob\n__orchard_end_t2__:0\n");
        // What was not read stays readable after the run ended, once.
        let late = output.read(Some(b"got ")).unwrap();
        assert_eq!((late.bytes.as_slice(), late.matched), (&b"got "[..], true));
        assert_eq!(output.read_all().bytes, b"bob\n");
        assert_eq!(output.read_all().bytes, b"");
        // The run still gets all of its output.
        assert_eq!(
            output.take_finished().unwrap().output.bytes(),
            b"name? got bob\n"
        );
    }

    #[test]
    fn a_prompt_that_looks_like_a_marker_start_can_still_be_read() {
        let output = ShellOutput::new(1024, None);
        output.begin_run(&EndMarker::new("t3"));
        output.accept(b"enter value__");
        let read = output.read(Some(b"value__")).unwrap();
        assert_eq!(read.bytes, b"enter value__");
    }

    #[test]
    fn the_cap_truncates_but_the_marker_is_still_found() {
        let output = ShellOutput::new(4, None);
        output.begin_run(&EndMarker::new("t4"));
        output.accept(&[b'x'; 100]);
        output.accept(b"__orchard_end_t4__:0\n");
        let finished = output.take_finished().unwrap();
        assert_eq!(finished.output.bytes(), b"xxxx");
        assert!(finished.output.truncated());
    }

    #[test]
    fn closing_flushes_held_bytes() {
        let output = ShellOutput::new(1024, None);
        output.begin_run(&EndMarker::new("t5"));
        output.accept(b"bye__orch");
        output.close();
        assert!(output.is_closed());
        assert_eq!(output.take_segment().bytes(), b"bye__orch");
    }

    #[test]
    fn output_is_charged_to_the_budget() {
        let budget = OutputBudget::new(1 << 20);
        let output = ShellOutput::new(1024, Some(Arc::clone(&budget)));
        output.accept(b"12345");
        assert_eq!(budget.used(), 5);
        drop(output.take_segment());
        assert_eq!(budget.used(), 0);
    }
}
