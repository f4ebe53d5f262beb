//! Instruction counts with valgrind's callgrind, for `make bench-callgrind`: a process is started under
//! `valgrind --tool=callgrind` (through a wrapper script, so the harness starts it as it would the
//! binary), its counters are zeroed before a measured stretch of work and dumped after it with
//! `callgrind_control`, and the dump's total of executed instructions (`Ir`) is read back. Counts of
//! user-space instructions do not move with the machine's load the way timings do (system calls are
//! counted as the instructions around them, not the kernel's work inside).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The total of executed instructions in a callgrind dump: its `totals:` line, else its `summary:`
/// line (pure).
pub fn parse_totals(dump: &str) -> Option<u64> {
    let value = |key: &str| {
        dump.lines()
            .find_map(|line| line.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
    };
    value("totals:").or_else(|| value("summary:"))
}

/// The highest-numbered dump `<prefix>.<n>` among `names` (pure): callgrind numbers its dumps 1, 2, …
pub fn latest_dump<'a>(
    prefix: &str,
    names: impl IntoIterator<Item = &'a str>,
) -> Option<(u32, &'a str)> {
    names
        .into_iter()
        .filter_map(|name| {
            let number = name.strip_prefix(prefix)?.strip_prefix('.')?.parse().ok()?;
            Some((number, name))
        })
        .max_by_key(|(number, _)| *number)
}

/// Whether `valgrind` and `callgrind_control` can be run; the error says how to get them.
pub fn check_tools() -> Result<(), String> {
    for (tool, arg) in [
        ("valgrind", "--version"),
        ("callgrind_control", "--version"),
    ] {
        let ran = Command::new(tool).arg(arg).output();
        if !ran.is_ok_and(|output| output.status.success()) {
            return Err(format!(
                "`{tool}` cannot be run; `make bench-callgrind` installs valgrind (the pinned Debian package)"
            ));
        }
    }
    Ok(())
}

/// A program run under callgrind: the wrapper that starts it, and its dumps.
pub struct Counted {
    /// Executable script that runs the program under callgrind with the arguments it is given.
    pub wrapper: PathBuf,
    /// What `callgrind_control` is told to address: the program's path, as valgrind reports it.
    program: String,
    dir: PathBuf,
    prefix: String,
    /// Where valgrind makes the FIFOs `callgrind_control` talks through: in `dir`, so a program
    /// stopped by a signal (valgrind then leaves them) leaves nothing in `/tmp`.
    vgdb_prefix: String,
}

impl Counted {
    /// Writes `dir/<name>.sh`, which runs `binary` under callgrind with its dumps in `dir/<name>.cg.<n>`
    /// and its FIFOs for `callgrind_control` in `dir` too.
    /// Nothing is counted until [`Counted::zero`] (`--collect-atstart` stays on so that the start-up
    /// shows in the first dump, should anyone look).
    pub fn prepare(dir: &Path, name: &str, binary: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir)?;
        let prefix = format!("{name}.cg");
        let wrapper = dir.join(format!("{name}.sh"));
        let vgdb_prefix = dir.join(format!("{name}.vgdb")).display().to_string();
        let script = format!(
            "#!/bin/sh\nexec valgrind --tool=callgrind --vgdb-prefix='{vgdb_prefix}' --callgrind-out-file='{}' '{}' \"$@\"\n",
            dir.join(&prefix).display(),
            binary.display()
        );
        std::fs::write(&wrapper, script)?;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
        Ok(Self {
            wrapper,
            program: binary.display().to_string(),
            dir: dir.to_path_buf(),
            prefix,
            vgdb_prefix,
        })
    }

    fn control(&self, flag: &str) -> Result<(), String> {
        let output = Command::new("callgrind_control")
            .arg(format!("--vgdb-prefix={}", self.vgdb_prefix))
            .arg(flag)
            .arg(&self.program)
            .output()
            .map_err(|e| format!("callgrind_control {flag}: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "callgrind_control {flag} {}: {}{}",
                self.program,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        Ok(())
    }

    fn latest(&self) -> Option<(u32, PathBuf)> {
        let names: Vec<String> = std::fs::read_dir(&self.dir)
            .ok()?
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .collect();
        latest_dump(&self.prefix, names.iter().map(String::as_str))
            .map(|(number, name)| (number, self.dir.join(name)))
    }

    /// Zeroes the counters: what runs from here on is in the next [`Counted::dump`].
    pub fn zero(&self) -> Result<(), String> {
        self.control("--zero")
    }

    /// Dumps the counters and returns the instructions executed since the last zero or dump.
    pub fn dump(&self) -> Result<u64, String> {
        let before = self.latest().map_or(0, |(number, _)| number);
        self.control("--dump")?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some((_, path)) = self.latest().filter(|(number, _)| *number > before)
                && let Some(total) = std::fs::read_to_string(&path)
                    .ok()
                    .as_deref()
                    .and_then(parse_totals)
            {
                return Ok(total);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "no new dump {}.<n> in {} after callgrind_control --dump",
                    self.prefix,
                    self.dir.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// One measured stretch of work: what it was, the instructions executed, the unit of work and how
/// many units were done.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub label: String,
    pub total: u64,
    pub unit: String,
    pub count: usize,
}

impl Row {
    /// A row of `count` units of `unit`.
    pub fn new(label: &str, total: u64, unit: &str, count: usize) -> Self {
        Self {
            label: label.to_string(),
            total,
            unit: unit.to_string(),
            count,
        }
    }

    /// Instructions per unit.
    pub fn per_unit(&self) -> f64 {
        self.total as f64 / self.count.max(1) as f64
    }

    /// `label<TAB>total<TAB>unit<TAB>count`: how a baseline run hands its rows over (pure).
    pub fn to_line(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}",
            self.label, self.total, self.unit, self.count
        )
    }

    /// The row of a [`Row::to_line`] line; `None` for any other line (pure).
    pub fn from_line(line: &str) -> Option<Self> {
        match line.split('\t').collect::<Vec<_>>()[..] {
            [label, total, unit, count] => Some(Self {
                label: label.to_string(),
                total: total.parse().ok()?,
                unit: unit.to_string(),
                count: count.parse().ok().filter(|count| *count > 0)?,
            }),
            _ => None,
        }
    }
}

/// `value` rounded, with thousands separators: `1,234,567` (pure).
pub fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// The Markdown table of `rows`, with a baseline column and the change where `baseline` has the same
/// row (pure).
pub fn table(rows: &[Row], baseline: Option<&[Row]>) -> String {
    let mut out = match baseline {
        Some(_) => String::from(
            "| path | baseline: instructions per unit | this build: instructions per unit | change | unit, count |\n|---|---|---|---|---|\n",
        ),
        None => String::from(
            "| path | instructions per unit (callgrind `Ir`) | unit, count |\n|---|---|---|\n",
        ),
    };
    for row in rows {
        let Row {
            label, unit, count, ..
        } = row;
        let now = thousands(row.per_unit());
        out.push_str(&match baseline {
            None => format!("| {label} | {now} | {unit}, {count} |\n"),
            Some(baseline) => match baseline.iter().find(|before| before.label == row.label) {
                Some(before) => format!(
                    "| {label} | {} | {now} | {:+.0} % | {unit}, {count} |\n",
                    thousands(before.per_unit()),
                    100.0 * (row.per_unit() / before.per_unit() - 1.0)
                ),
                None => format!("| {label} | | {now} | | {unit}, {count} |\n"),
            },
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_come_from_the_totals_line_else_the_summary() {
        let dump = "version: 1\ncreator: callgrind-3.19.0\nevents: Ir\nsummary: 11202349\n\nfn=main\n1 2\ntotals: 11202350\n";
        assert_eq!(parse_totals(dump), Some(11_202_350));
        assert_eq!(parse_totals("summary: 42\n"), Some(42));
        assert_eq!(parse_totals("events: Ir\n"), None);
        assert_eq!(parse_totals("totals: many\n"), None);
    }

    #[test]
    fn the_latest_dump_is_the_highest_number_not_the_last_listed() {
        let names = [
            "agent.cg.2",
            "agent.cg",
            "agent.cg.10",
            "operator.cg.11",
            "agent.cg.x",
            "agent.sh",
        ];
        assert_eq!(latest_dump("agent.cg", names), Some((10, "agent.cg.10")));
        assert_eq!(latest_dump("gateway.cg", names), None);
    }

    #[test]
    fn rows_cross_from_a_baseline_run_and_tabulate_with_the_change() {
        let row = Row::new("gateway exec", 62_500_000, "request", 500);
        assert_eq!(Row::from_line(&row.to_line()), Some(row.clone()));
        assert_eq!(Row::from_line("callgrind's dumps are in /x"), None);
        assert_eq!(Row::from_line("a\tmany\tb\t3"), None);
        assert_eq!(Row::from_line("a\t1\tb\t0"), None, "no units, no division");
        assert_eq!(thousands(124_959.4), "124,959");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1_000.0), "1,000");
        let before = [Row::new("gateway exec", 86_500_000, "request", 500)];
        let now = [row, Row::new("new path", 10, "call", 1)];
        let with = table(&now, Some(&before));
        assert!(
            with.contains("| gateway exec | 173,000 | 125,000 | -28 % | request, 500 |"),
            "{with}"
        );
        assert!(with.contains("| new path | | 10 | | call, 1 |"), "{with}");
        assert!(table(&now, None).contains("| gateway exec | 125,000 | request, 500 |"));
    }
}
