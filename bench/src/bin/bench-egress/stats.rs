//! The pure parts of bench-egress: percentiles, the `/proc` lines it reads, the proxy's answer to
//! `CONNECT`, and the units of the report.

use std::time::Duration;

/// Bytes in a MiB.
pub const MIB: f64 = 1024.0 * 1024.0;

/// Bytes in a GiB.
pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The `p`-quantile (0..=1) of `samples` by nearest rank on the sorted samples (index
/// `round((n - 1) * p)`); `None` when there are none (pure).
pub fn percentile(samples: &[Duration], p: f64) -> Option<Duration> {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let last = sorted.len().checked_sub(1)?;
    let index = ((last as f64) * p.clamp(0.0, 1.0)).round() as usize;
    sorted.get(index.min(last)).copied()
}

/// The resident set size in bytes from the text of `/proc/self/status` (its `VmRSS:` line, in kB)
/// (pure).
pub fn vm_rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let mut fields = line["VmRSS:".len()..].split_whitespace();
    let kib: u64 = fields.next()?.parse().ok()?;
    (fields.next()? == "kB").then_some(kib * 1024)
}

/// Where the head of an HTTP response ends (the index just past its blank line), if `buffer` holds
/// all of it (pure).
pub fn head_end(buffer: &[u8]) -> Option<usize> {
    buffer
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .map(|at| at + 4)
}

/// The status code of an HTTP/1.x response head, e.g. `HTTP/1.1 200 Connection established`
/// (pure).
pub fn status_code(head: &[u8]) -> Result<u16, String> {
    let text = String::from_utf8_lossy(head);
    let line = text.lines().next().unwrap_or_default();
    let mut parts = line.split(' ');
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        return Err(format!("not an HTTP/1 response: {line:?}"));
    }
    parts
        .next()
        .and_then(|code| code.parse().ok())
        .filter(|code| (100..1000).contains(code))
        .ok_or_else(|| format!("no status code in {line:?}"))
}

/// MiB per second for `bytes` in `elapsed` (pure).
pub fn mib_per_s(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / MIB / elapsed.as_secs_f64()
}

/// CPU seconds per GiB for `cpu_seconds` spent moving `bytes` (pure).
pub fn per_gib(cpu_seconds: f64, bytes: u64) -> f64 {
    cpu_seconds / (bytes as f64 / GIB)
}

/// A duration in milliseconds with two decimals.
pub fn ms(duration: Duration) -> String {
    format!("{:.2} ms", duration.as_secs_f64() * 1000.0)
}

/// `later - earlier` in milliseconds, signed.
pub fn signed_ms(later: Duration, earlier: Duration) -> String {
    format!(
        "{:+.2} ms",
        (later.as_secs_f64() - earlier.as_secs_f64()) * 1000.0
    )
}

/// Bytes as MiB with one decimal.
pub fn mib(bytes: i64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB)
}
