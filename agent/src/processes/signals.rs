//! Signal names and numbers accepted by `POST /v1/processes/{id}/signal` and
//! `POST /v1/sessions/{id}/signal`.

/// `"TERM"`, `"SIGTERM"` or a number (the shared wire type).
pub use orchard_api::agent::SignalSpec;

const NAMED: &[(&str, i32)] = &[
    ("HUP", libc::SIGHUP),
    ("INT", libc::SIGINT),
    ("QUIT", libc::SIGQUIT),
    ("KILL", libc::SIGKILL),
    ("USR1", libc::SIGUSR1),
    ("USR2", libc::SIGUSR2),
    ("TERM", libc::SIGTERM),
    ("CONT", libc::SIGCONT),
    ("STOP", libc::SIGSTOP),
    ("ALRM", libc::SIGALRM),
    ("WINCH", libc::SIGWINCH),
];

/// The number of a requested signal (the wire type lives in `orchard-api`; the names are the agent's).
pub trait SignalNumber {
    /// The signal number, or a message naming the accepted values.
    fn number(&self) -> Result<i32, String>;
}

impl SignalNumber for SignalSpec {
    fn number(&self) -> Result<i32, String> {
        match self {
            SignalSpec::Number(number) if (1..=64).contains(number) => Ok(*number as i32),
            SignalSpec::Number(number) => {
                Err(format!("signal number {number} is out of range 1..=64"))
            }
            SignalSpec::Name(name) => {
                let upper = name.trim().to_ascii_uppercase();
                let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
                NAMED
                    .iter()
                    .find(|(known, _)| *known == bare)
                    .map(|(_, number)| *number)
                    .ok_or_else(|| {
                        let names: Vec<&str> = NAMED.iter().map(|(known, _)| *known).collect();
                        format!(
                            "unknown signal `{name}`; use one of {} or a number",
                            names.join(", ")
                        )
                    })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers() {
        assert_eq!(SignalSpec::Name("TERM".into()).number(), Ok(libc::SIGTERM));
        assert_eq!(
            SignalSpec::Name("sigkill".into()).number(),
            Ok(libc::SIGKILL)
        );
        assert_eq!(SignalSpec::Number(10).number(), Ok(10));
        assert!(SignalSpec::Number(0).number().is_err());
        assert!(SignalSpec::Name("BOGUS".into()).number().is_err());
        let parsed: SignalSpec = serde_json::from_str("\"INT\"").unwrap();
        assert_eq!(parsed.number(), Ok(libc::SIGINT));
        let parsed: SignalSpec = serde_json::from_str("15").unwrap();
        assert_eq!(parsed.number(), Ok(15));
    }
}
