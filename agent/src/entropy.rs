//! Random identifiers (process ids, temp-file names) from the kernel's `getrandom`, no RNG crate needed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// 64 random bits; falls back to time, pid and a counter if `getrandom` is unavailable.
pub fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: the buffer is valid for 8 bytes of writes.
    let filled =
        unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), libc::GRND_NONBLOCK) };
    if filled == bytes.len() as isize {
        return u64::from_ne_bytes(bytes);
    }
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos
        ^ (u64::from(std::process::id()) << 32)
        ^ COUNTER.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
}

/// A short random lowercase hex string (16 characters).
pub fn random_hex() -> String {
    format!("{:016x}", random_u64())
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_differ() {
        assert_ne!(super::random_hex(), super::random_hex());
        assert_eq!(super::random_hex().len(), 16);
    }
}
