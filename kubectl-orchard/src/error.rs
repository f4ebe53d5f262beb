//! The plugin's one error type, how each error is printed (`error: <code>: <message>`), and the exit
//! status it gives.

use serde_json::Value;

/// Why a subcommand failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The gateway (or the agent behind it) answered with an error.
    #[error("{code}: {message}")]
    Gateway {
        /// HTTP status of the answer.
        status: u16,
        /// The answer's `code` (`NotFound`, `Forbidden`, ...), or `HTTP <status>` when the body was not
        /// an error object.
        code: String,
        /// The answer's `message`.
        message: String,
    },
    /// A setting is missing or malformed (gateway URL, token, kubeconfig).
    #[error("{0}")]
    Settings(String),
    /// The command line asks for something that cannot be done (`cp` between two sandboxes, ...).
    #[error("{0}")]
    Usage(String),
    /// The gateway could not be reached, or the connection broke.
    #[error("cannot reach the gateway at {url}: {reason}")]
    Connection {
        /// The gateway URL.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The sandbox is not in the state asked for (not Ready, and why).
    #[error("{0}")]
    Sandbox(String),
    /// A local file or directory could not be read or written.
    #[error("{0}")]
    Local(String),
    /// The gateway answered something that is not what the route documents.
    #[error("unexpected answer from the gateway: {0}")]
    Protocol(String),
}

/// Result of the plugin's operations.
pub type Result<T> = std::result::Result<T, CliError>;

impl CliError {
    /// The error of a gateway answer with a non-success `status` and `body` (pure): its JSON
    /// `{"code", "message"}`, or the status and the start of the body when it is not one.
    pub fn from_answer(status: u16, body: &[u8]) -> Self {
        let parsed: Option<Value> = serde_json::from_slice(body).ok();
        let field = |name: &str| {
            parsed
                .as_ref()
                .and_then(|value| value.get(name))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        match (field("code"), field("message")) {
            (Some(code), message) => Self::Gateway {
                status,
                code,
                message: message.unwrap_or_default(),
            },
            (None, _) => {
                let text = String::from_utf8_lossy(body);
                let shown: String = text.trim().chars().take(200).collect();
                Self::Gateway {
                    status,
                    code: format!("HTTP {status}"),
                    message: if shown.is_empty() {
                        "(empty body)".to_string()
                    } else {
                        shown
                    },
                }
            }
        }
    }

    /// The error of a local I/O failure on `what`.
    pub fn local(what: impl std::fmt::Display, error: impl std::fmt::Display) -> Self {
        Self::Local(format!("{what}: {error}"))
    }

    /// The line printed on standard error (pure).
    pub fn line(&self) -> String {
        format!("error: {self}")
    }

    /// The process exit status: 1 for every error (a command's own status is not an error).
    pub fn exit_code(&self) -> u8 {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_errors_print_code_and_message() {
        let error = CliError::from_answer(
            404,
            br#"{"code": "NotFound", "message": "sandbox rl/x not found", "retryable": false}"#,
        );
        assert_eq!(error.line(), "error: NotFound: sandbox rl/x not found");
        assert_eq!(error.exit_code(), 1);
    }

    #[test]
    fn bodies_that_are_not_errors_show_the_status() {
        let error = CliError::from_answer(502, b"Bad Gateway\n");
        assert_eq!(error.line(), "error: HTTP 502: Bad Gateway");
        let empty = CliError::from_answer(500, b"");
        assert_eq!(empty.line(), "error: HTTP 500: (empty body)");
        let json_without_code = CliError::from_answer(400, br#"{"detail": "x"}"#);
        assert!(json_without_code.line().starts_with("error: HTTP 400: {"));
    }

    #[test]
    fn other_errors_are_one_line() {
        let error = CliError::Connection {
            url: "http://gw:8080".into(),
            reason: "connection refused".into(),
        };
        assert_eq!(
            error.line(),
            "error: cannot reach the gateway at http://gw:8080: connection refused"
        );
    }
}
