//! `orchard-layer-filter KEEP_FILE < layer.tar > kept.tar`: the SandboxSnapshot committer's filter
//! (the `orchard-committer` image; docs/SNAPSHOTS.md). It reads an image layer (an uncompressed tar,
//! as containerd's diff writes it) and writes the entries under the absolute paths listed in
//! KEEP_FILE (one per line), byte for byte with their PAX and GNU extension headers, plus:
//! - the whiteout of a kept path itself (`dir/.wh.name`: the sandbox deleted it),
//! - the directory entries of a kept path's ancestors (their owner and mode, when the sandbox created
//!   them), but nothing else of theirs (no opaque marker, no sibling).
//!
//! Entries are never re-encoded: extended attributes (file capabilities), hard links, owners and
//! times stay as containerd wrote them. `/` keeps everything. Exit status 1 with a message on a
//! malformed archive.

use std::io::{self, BufRead, Read, Write};

const BLOCK: usize = 512;

/// The paths to keep, normalised: no leading or trailing slash (`""` is the whole root).
fn keep_list(text: &str) -> Vec<String> {
    text.lines()
        .filter(|line| line.starts_with('/'))
        .map(|line| line.trim_matches('/').to_string())
        .collect()
}

/// An entry name as a path without `./`, leading or trailing slashes.
fn normalise(name: &str) -> &str {
    let name = name.strip_prefix("./").unwrap_or(name);
    name.trim_matches('/')
}

/// The whiteout entry that deletes `path` (`dir/.wh.name`).
fn whiteout_of(path: &str) -> String {
    match path.rsplit_once('/') {
        Some((parent, base)) => format!("{parent}/.wh.{base}"),
        None => format!(".wh.{path}"),
    }
}

/// Whether the entry `name` (a directory when `is_dir`) is kept for `keep` (pure).
fn kept(name: &str, is_dir: bool, keep: &[String]) -> bool {
    let entry = normalise(name);
    keep.iter().any(|path| {
        path.is_empty()
            || entry == path
            || entry
                .strip_prefix(path.as_str())
                .is_some_and(|rest| rest.starts_with('/'))
            || entry == whiteout_of(path)
            || (is_dir
                && !entry.is_empty()
                && path
                    .strip_prefix(entry)
                    .is_some_and(|rest| rest.starts_with('/')))
    })
}

/// The number in a header's numeric field: octal text, or GNU base-256 (high bit set).
fn number(field: &[u8]) -> Result<u64, String> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        let mut value: u64 = u64::from(field[0] & 0x7f);
        for byte in &field[1..] {
            value = value
                .checked_mul(256)
                .and_then(|v| v.checked_add(u64::from(*byte)))
                .ok_or("a base-256 size overflows")?;
        }
        return Ok(value);
    }
    let text: String = field
        .iter()
        .take_while(|b| **b != 0)
        .map(|b| *b as char)
        .collect();
    let text = text.trim();
    if text.is_empty() {
        return Ok(0);
    }
    u64::from_str_radix(text, 8).map_err(|e| format!("bad octal number `{text}`: {e}"))
}

/// A NUL-terminated text field.
fn text(field: &[u8]) -> String {
    let end = field.iter().position(|b| *b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// The name a ustar header gives (prefix/name), before any PAX or GNU long name.
fn header_name(header: &[u8]) -> String {
    let name = text(&header[0..100]);
    // POSIX ustar (`ustar\0`) has a 155-byte prefix; GNU's `ustar  ` uses those bytes otherwise.
    if &header[257..263] == b"ustar\0" {
        let prefix = text(&header[345..500]);
        if !prefix.is_empty() {
            return format!("{prefix}/{name}");
        }
    }
    name
}

/// The `path` record of PAX extended header data, if any.
fn pax_path(data: &[u8]) -> Option<String> {
    let mut rest = data;
    let mut path = None;
    while !rest.is_empty() {
        let space = rest.iter().position(|b| *b == b' ')?;
        let length: usize = std::str::from_utf8(&rest[..space]).ok()?.parse().ok()?;
        if length == 0 || length > rest.len() {
            return path;
        }
        let record = &rest[space + 1..length];
        let record = record.strip_suffix(b"\n").unwrap_or(record);
        if let Some(value) = record.strip_prefix(b"path=") {
            path = Some(String::from_utf8_lossy(value).into_owned());
        }
        rest = &rest[length..];
    }
    path
}

/// Reads exactly `buf.len()` bytes; `false` at a clean end of input before the first byte.
fn read_block(input: &mut impl Read, buf: &mut [u8]) -> Result<bool, String> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) if filled == 0 => return Ok(false),
            Ok(0) => return Err("the archive ends inside a block".into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("reading the archive: {e}")),
        }
    }
    Ok(true)
}

/// Reads an entry's data (padded to whole blocks).
fn read_data(input: &mut impl Read, size: u64) -> Result<Vec<u8>, String> {
    let padded = size.div_ceil(BLOCK as u64) * BLOCK as u64;
    let padded = usize::try_from(padded).map_err(|_| "an entry is too large")?;
    let mut data = vec![0u8; padded];
    if padded > 0 && !read_block(input, &mut data)? {
        return Err("the archive ends inside an entry".into());
    }
    Ok(data)
}

/// Copies an entry's data to `output` (or skips it) without holding it in memory.
fn pass_data(
    input: &mut impl Read,
    output: &mut impl Write,
    size: u64,
    keep: bool,
) -> Result<(), String> {
    let mut left = size.div_ceil(BLOCK as u64) * BLOCK as u64;
    let mut buf = vec![0u8; 64 * BLOCK];
    while left > 0 {
        let n = usize::try_from(left.min(buf.len() as u64)).unwrap_or(buf.len());
        if !read_block(input, &mut buf[..n])? {
            return Err("the archive ends inside an entry".into());
        }
        if keep {
            output
                .write_all(&buf[..n])
                .map_err(|e| format!("writing: {e}"))?;
        }
        left -= n as u64;
    }
    Ok(())
}

/// Filters the archive on `input` into `output`, keeping the entries `keep` selects (see the module
/// documentation). Returns how many entries were kept and dropped.
fn filter(
    input: &mut impl Read,
    output: &mut impl Write,
    keep: &[String],
) -> Result<(u64, u64), String> {
    let mut pending: Vec<u8> = Vec::new();
    let mut long_name: Option<String> = None;
    let mut pax_name: Option<String> = None;
    let (mut kept_count, mut dropped) = (0u64, 0u64);
    let mut header = [0u8; BLOCK];
    let write = |output: &mut dyn Write, bytes: &[u8]| {
        output.write_all(bytes).map_err(|e| format!("writing: {e}"))
    };
    loop {
        if !read_block(input, &mut header)? || header.iter().all(|b| *b == 0) {
            break;
        }
        let size = number(&header[124..136])?;
        match header[156] {
            // Extensions of the next entry: held until its name is known.
            b'x' | b'L' | b'K' => {
                let data = read_data(input, size)?;
                let body = &data[..usize::try_from(size).unwrap_or(0).min(data.len())];
                match header[156] {
                    b'x' => pax_name = pax_path(body).or(pax_name),
                    b'L' => long_name = Some(text(body)),
                    _ => {}
                }
                pending.extend_from_slice(&header);
                pending.extend_from_slice(&data);
            }
            // A global PAX header applies to everything after it: always passed on.
            b'g' => {
                write(output, &header)?;
                pass_data(input, output, size, true)?;
            }
            typeflag => {
                let name = pax_name
                    .take()
                    .or_else(|| long_name.take())
                    .unwrap_or_else(|| header_name(&header));
                let is_dir = typeflag == b'5' || name.ends_with('/');
                // Hard links, symlinks, devices and directories carry no data; a size on them is
                // not read as data (as tar readers do), except for regular files and unknown types.
                let data_size = match typeflag {
                    b'1' | b'2' | b'3' | b'4' | b'5' | b'6' => 0,
                    _ => size,
                };
                let keep_it = kept(&name, is_dir, keep);
                if keep_it {
                    write(output, &pending)?;
                    write(output, &header)?;
                    kept_count += 1;
                } else {
                    dropped += 1;
                }
                pass_data(input, output, data_size, keep_it)?;
                pending.clear();
            }
        }
    }
    write(output, &[0u8; 2 * BLOCK])?;
    output.flush().map_err(|e| format!("writing: {e}"))?;
    Ok((kept_count, dropped))
}

fn main() {
    let Some(list) = std::env::args().nth(1) else {
        eprintln!("usage: orchard-layer-filter KEEP_FILE < layer.tar > kept.tar");
        std::process::exit(2);
    };
    let keep = match std::fs::read_to_string(&list) {
        Ok(text) => keep_list(&text),
        Err(e) => {
            eprintln!("orchard-layer-filter: cannot read {list}: {e}");
            std::process::exit(2);
        }
    };
    let stdin = io::stdin();
    let mut input = io::BufReader::with_capacity(1 << 20, stdin.lock());
    let _ = input.fill_buf();
    let stdout = io::stdout();
    let mut output = io::BufWriter::with_capacity(1 << 20, stdout.lock());
    match filter(&mut input, &mut output, &keep) {
        Ok((kept, dropped)) => {
            eprintln!("orchard-layer-filter: kept {kept} entries, left out {dropped}")
        }
        Err(e) => {
            eprintln!("orchard-layer-filter: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn octal(field: &mut [u8], value: u64) {
        let text = format!("{value:0width$o}\0", width = field.len() - 1);
        field.copy_from_slice(text.as_bytes());
    }

    fn header(name: &str, typeflag: u8, size: u64) -> [u8; BLOCK] {
        let mut h = [0u8; BLOCK];
        h[..name.len()].copy_from_slice(name.as_bytes());
        octal(&mut h[100..108], 0o644);
        octal(&mut h[124..136], size);
        h[156] = typeflag;
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h
    }

    fn entry(out: &mut Vec<u8>, name: &str, typeflag: u8, data: &[u8]) {
        out.extend_from_slice(&header(name, typeflag, data.len() as u64));
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(BLOCK) * BLOCK, 0);
    }

    fn pax(out: &mut Vec<u8>, path: &str) {
        let record = |body: &str| {
            let mut length = body.len() + 3;
            loop {
                let line = format!("{length} {body}\n");
                if line.len() == length {
                    return line;
                }
                length = line.len();
            }
        };
        let data = format!(
            "{}{}",
            record(&format!("path={path}")),
            record("SCHILY.xattr.security.capability=x")
        );
        entry(out, "PaxHeaders/x", b'x', data.as_bytes());
    }

    fn names(archive: &[u8]) -> Vec<String> {
        let mut found = Vec::new();
        let mut at = 0;
        let mut next = None;
        while at + BLOCK <= archive.len() {
            let h = &archive[at..at + BLOCK];
            if h.iter().all(|b| *b == 0) {
                break;
            }
            let size = number(&h[124..136]).unwrap() as usize;
            let data = &archive[at + BLOCK..at + BLOCK + size];
            match h[156] {
                b'x' => next = pax_path(data),
                b'L' => next = Some(text(data)),
                _ => found.push(next.take().unwrap_or_else(|| header_name(h))),
            }
            at += BLOCK + size.div_ceil(BLOCK) * BLOCK;
        }
        found
    }

    fn layer() -> Vec<u8> {
        let mut a = Vec::new();
        entry(&mut a, "etc/", b'5', b"");
        entry(&mut a, "etc/hosts", b'0', b"");
        entry(&mut a, "root/", b'5', b"");
        entry(&mut a, "root/work/", b'5', b"");
        entry(&mut a, "root/work/a.txt", b'0', &[7u8; 700]);
        entry(&mut a, "root/.wh..wh..opq", b'0', b"");
        entry(&mut a, "root/workshop", b'0', b"x");
        entry(&mut a, "root/.wh.gone", b'0', b"");
        pax(&mut a, &format!("root/work/{}", "n".repeat(120)));
        entry(&mut a, "root/work/placeholder", b'0', b"long");
        let long = format!("usr/{}", "l".repeat(150));
        entry(
            &mut a,
            "././@LongLink",
            b'L',
            format!("{long}\0").as_bytes(),
        );
        entry(&mut a, "usr/truncated", b'0', b"gnu");
        entry(&mut a, "root/work/link", b'1', b"");
        entry(&mut a, "tmp/scratch", b'0', b"s");
        a.extend_from_slice(&[0u8; 2 * BLOCK]);
        a
    }

    fn run(keep: &str) -> (Vec<String>, Vec<u8>) {
        let mut out = Vec::new();
        filter(&mut layer().as_slice(), &mut out, &keep_list(keep)).unwrap();
        (names(&out), out)
    }

    #[test]
    fn a_kept_path_keeps_its_tree_its_whiteout_and_its_ancestors_only() {
        let (kept, _) = run("/root/work\n/root/gone\n");
        assert_eq!(
            kept,
            vec![
                "root/".to_string(),
                "root/work/".into(),
                "root/work/a.txt".into(),
                "root/.wh.gone".into(),
                format!("root/work/{}", "n".repeat(120)),
                "root/work/link".into(),
            ],
            "no opaque marker of /root, no /root/workshop, nothing outside"
        );
    }

    #[test]
    fn kept_entries_are_copied_byte_for_byte_with_their_extensions() {
        let (_, out) = run("/root/work/");
        let source = layer();
        let a_txt = &source[4 * BLOCK..6 * BLOCK];
        assert!(out.windows(a_txt.len()).any(|w| w == a_txt), "data kept");
        assert!(
            out.windows(b"SCHILY.xattr".len())
                .any(|w| w == b"SCHILY.xattr"),
            "the PAX header (and its xattrs) goes with its entry"
        );
        assert_eq!(out.len() % BLOCK, 0);
        assert!(out.ends_with(&[0u8; 2 * BLOCK]));
    }

    #[test]
    fn gnu_long_names_and_the_root_are_understood() {
        let (kept, _) = run("/usr");
        assert_eq!(kept, vec![format!("usr/{}", "l".repeat(150))]);
        let (all, _) = run("/");
        assert_eq!(all.len(), 12, "`/` keeps everything: {all:?}");
        let (none, out) = run("/nothing/here");
        assert!(none.is_empty());
        assert_eq!(out.len(), 2 * BLOCK, "an empty archive");
    }

    #[test]
    fn numbers_are_octal_or_base_256() {
        assert_eq!(number(b"00000001750\0").unwrap(), 1000);
        assert_eq!(number(b"     1750 \0").unwrap(), 1000);
        let mut big = [0u8; 12];
        big[0] = 0x80;
        big[11] = 1;
        big[10] = 1;
        assert_eq!(number(&big).unwrap(), 257);
        assert!(number(b"9z\0").is_err());
    }

    #[test]
    fn a_truncated_archive_is_an_error() {
        let source = layer();
        let mut out = Vec::new();
        let cut = &source[..5 * BLOCK + 10];
        assert!(filter(&mut &cut[..], &mut out, &keep_list("/root")).is_err());
    }
}
