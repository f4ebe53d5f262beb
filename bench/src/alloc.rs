//! The benchmarks' allocator: mimalloc, as in the operator's binary (`operator/src/main.rs`); while
//! [`count`] is on in a thread, it also keeps the bytes that thread allocated and did not free, so a
//! structure built there is counted exactly (bench-egress: the policy table; bench-control-plane:
//! the operator's watch caches), whatever the other threads do meanwhile. Off, it costs one
//! thread-local read per allocation. A binary makes it its allocator with
//! `#[global_allocator] static ALLOCATOR: orchard_bench::alloc::Counting = orchard_bench::alloc::Counting;`.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, Ordering};

use mimalloc::MiMalloc;

thread_local! {
    // `const` and without a destructor: reading it never allocates, so the allocator may.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}
static LIVE: AtomicIsize = AtomicIsize::new(0);

/// mimalloc, counting while asked to.
pub struct Counting;

fn add(bytes: isize) {
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        LIVE.fetch_add(bytes, Ordering::Relaxed);
    }
}

// SAFETY: every call is passed on to mimalloc unchanged; the counter only observes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as the caller promised for `layout`.
        let pointer = unsafe { MiMalloc.alloc(layout) };
        if !pointer.is_null() {
            add(layout.size() as isize);
        }
        pointer
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as the caller promised for `layout`.
        let pointer = unsafe { MiMalloc.alloc_zeroed(layout) };
        if !pointer.is_null() {
            add(layout.size() as isize);
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: `pointer` came from this allocator with `layout`.
        unsafe { MiMalloc.dealloc(pointer, layout) };
        add(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `pointer` came from this allocator with `layout`.
        let moved = unsafe { MiMalloc.realloc(pointer, layout, new_size) };
        if !moved.is_null() {
            add(new_size as isize - layout.size() as isize);
        }
        moved
    }
}

/// Starts or stops counting in the calling thread (the count stays).
pub fn count(on: bool) {
    COUNTING.with(|c| c.set(on));
}

/// Bytes allocated and not freed by threads while they were counting.
pub fn live() -> isize {
    LIVE.load(Ordering::SeqCst)
}

unsafe extern "C" {
    /// mimalloc's own: frees what it holds for later (`force`: all of it, now).
    fn mi_collect(force: bool);
}

/// Returns the memory mimalloc keeps for later to the system, so the next RSS reading counts what
/// is in use.
pub fn collect() {
    // SAFETY: mi_collect only releases memory mimalloc holds free.
    unsafe { mi_collect(true) }
}
