//! The agent-wide output budget (`--max-output-bytes-total`): buffered output of every exec and every
//! background process together never exceeds it, whatever each request's `maxOutputBytes` allows.
//! Output is charged as it is captured and given back when the exec's response has been built or the
//! background process is forgotten; output that finds the budget exhausted is dropped and the stream
//! marked truncated, exactly like output past `maxOutputBytes`. Streamed output (`/v1/exec/stream`) is
//! not buffered, so it is not charged.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A shared byte budget: `reserve` grants what is left, `release` gives bytes back.
#[derive(Debug)]
pub struct OutputBudget {
    limit: u64,
    used: AtomicU64,
}

impl OutputBudget {
    pub fn new(limit: u64) -> Arc<Self> {
        Arc::new(OutputBudget {
            limit,
            used: AtomicU64::new(0),
        })
    }

    /// The configured total.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes currently charged.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// Reserves up to `wanted` bytes; returns how many were granted (fewer, or 0, when the budget is
    /// short).
    pub fn reserve(&self, wanted: u64) -> u64 {
        let mut granted = 0;
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                granted = wanted.min(self.limit.saturating_sub(used));
                Some(used + granted)
            });
        granted
    }

    /// Gives back `bytes` reserved earlier.
    pub fn release(&self, bytes: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(bytes))
            });
    }
}

/// Bytes one output buffer holds against a budget; given back when dropped. Without a budget it
/// grants everything (tests, fuzz targets).
#[derive(Debug, Default)]
pub struct Charge {
    budget: Option<Arc<OutputBudget>>,
    bytes: u64,
}

impl Charge {
    pub fn new(budget: Arc<OutputBudget>) -> Self {
        Charge {
            budget: Some(budget),
            bytes: 0,
        }
    }

    /// Asks for `wanted` more bytes; returns how many may be kept.
    pub fn grow(&mut self, wanted: usize) -> usize {
        match &self.budget {
            None => wanted,
            Some(budget) => {
                let granted = budget.reserve(wanted as u64);
                self.bytes += granted;
                // `granted <= wanted`, so it fits in usize.
                usize::try_from(granted).unwrap_or(wanted)
            }
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if let Some(budget) = &self.budget {
            budget.release(self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_grants_what_is_left_and_release_gives_it_back() {
        let budget = OutputBudget::new(10);
        assert_eq!(budget.reserve(4), 4);
        assert_eq!(budget.reserve(10), 6);
        assert_eq!(budget.reserve(1), 0);
        budget.release(5);
        assert_eq!(budget.used(), 5);
        assert_eq!(budget.reserve(7), 5);
        budget.release(100);
        assert_eq!(budget.used(), 0, "never below zero");
    }

    #[test]
    fn charges_are_released_on_drop() {
        let budget = OutputBudget::new(8);
        let mut first = Charge::new(Arc::clone(&budget));
        assert_eq!(first.grow(5), 5);
        let mut second = Charge::new(Arc::clone(&budget));
        assert_eq!(second.grow(5), 3);
        assert_eq!((first.bytes(), second.bytes()), (5, 3));
        drop(first);
        assert_eq!(budget.used(), 3);
        drop(second);
        assert_eq!(budget.used(), 0);
        let mut free = Charge::default();
        assert_eq!(free.grow(1 << 40), 1 << 40);
    }
}
