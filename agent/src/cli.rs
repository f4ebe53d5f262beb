//! Command-line and environment parsing for `orchard-agent` (hand-written: no parser dependency keeps the
//! binary small). Pure: the environment is passed in as a lookup function so every rule is unit-tested.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Default address the server binds to (all interfaces: the gateway reaches the agent at the Pod IP).
pub const DEFAULT_LISTEN: &str = "0.0.0.0:9090";
/// Default cap on in-flight `/v1` requests before the agent answers 429.
pub const DEFAULT_MAX_CONCURRENT: usize = 256;
/// Default cap on JSON request bodies.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 16 * 1024 * 1024;
/// Default cap on one uploaded file.
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 8 * 1024 * 1024 * 1024;

/// Prefix of every environment variable the agent reads; all of them are scrubbed from children's env.
pub const ENV_PREFIX: &str = "ORCHARD_AGENT_";

pub const USAGE: &str = "\
usage:
  orchard-agent serve [--listen ADDR] [--token-file PATH] [--root DIR] [--max-concurrent N]
                      [--max-body-bytes SIZE] [--max-upload-bytes SIZE]
  orchard-agent install DIR      copy this executable to DIR/orchard-agent (mode 0755) and print the path
  orchard-agent --version
  orchard-agent --help

serve options (flag, then environment variable, then default):
  --listen ADDR            ORCHARD_AGENT_LISTEN          literal socket address, default 0.0.0.0:9090
  --token-file PATH        ORCHARD_AGENT_TOKEN_FILE      file holding the bearer token (or ORCHARD_AGENT_TOKEN=value)
  --root DIR               ORCHARD_AGENT_ROOT            default cwd and base of relative paths, default: current dir
  --max-concurrent N       ORCHARD_AGENT_MAX_CONCURRENT  in-flight /v1 requests before 429, default 256
  --max-body-bytes SIZE    ORCHARD_AGENT_MAX_BODY_BYTES  JSON body limit, default 16MiB
  --max-upload-bytes SIZE  ORCHARD_AGENT_MAX_UPLOAD_BYTES  uploaded file limit, default 8GiB
  ORCHARD_AGENT_STARTUP    JSON {\"argv\":[..]} or {\"command\":\"..\"}: background process `startup` at boot
  ORCHARD_AGENT_LOG        log filter (error|warn|info|debug|trace, or target=level,...), default info
  ORCHARD_AGENT_DIE_WITH_PARENT  pid of the expected parent: exit when it exits (supervisors other than a container runtime)
SIZE accepts a byte count or a suffix: K, M, G (also KiB, MiB, GiB; all powers of 1024).";

/// What the command line asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    Serve(ServeOptions),
    Install { dir: PathBuf },
    Version,
    Help,
}

/// Where the bearer token comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    File(PathBuf),
    /// Given directly in `ORCHARD_AGENT_TOKEN`.
    Value(String),
}

/// Settings of `orchard-agent serve`, after merging flags, environment and defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeOptions {
    pub listen: SocketAddr,
    pub token: Option<TokenSource>,
    /// `None` means the process' current directory.
    pub root: Option<PathBuf>,
    pub max_concurrent: usize,
    pub max_body_bytes: u64,
    pub max_upload_bytes: u64,
    /// Raw JSON of `ORCHARD_AGENT_STARTUP`, parsed by the server.
    pub startup: Option<String>,
    /// Raw `ORCHARD_AGENT_LOG` filter.
    pub log_filter: Option<String>,
}

/// A command line that cannot be honoured; the message says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CliError(pub String);

/// Parses `args` (without the program name); `env` looks up environment variables.
pub fn parse(
    args: &[String],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Invocation, CliError> {
    let Some(first) = args.first() else {
        return Err(CliError(
            "missing subcommand (serve, install or --version)".into(),
        ));
    };
    match first.as_str() {
        "--version" | "-V" | "version" => Ok(Invocation::Version),
        "--help" | "-h" | "help" => Ok(Invocation::Help),
        "install" => match &args[1..] {
            [dir] if !dir.starts_with('-') => Ok(Invocation::Install {
                dir: PathBuf::from(dir),
            }),
            _ => Err(CliError("usage: orchard-agent install DIR".into())),
        },
        "serve" => parse_serve(&args[1..], env).map(Invocation::Serve),
        other => Err(CliError(format!(
            "unknown subcommand `{other}` (expected serve, install or --version)"
        ))),
    }
}

fn parse_serve(
    args: &[String],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ServeOptions, CliError> {
    let mut listen = None;
    let mut token_file = None;
    let mut root = None;
    let mut max_concurrent = None;
    let mut max_body = None;
    let mut max_upload = None;

    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if arg == "--help" || arg == "-h" {
            return Err(CliError("serve takes only the options below".into()));
        }
        let (name, inline_value) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value.to_string())),
            _ => (arg.as_str(), None),
        };
        let slot = match name {
            "--listen" => &mut listen,
            "--token-file" => &mut token_file,
            "--root" => &mut root,
            "--max-concurrent" => &mut max_concurrent,
            "--max-body-bytes" => &mut max_body,
            "--max-upload-bytes" => &mut max_upload,
            _ => return Err(CliError(format!("unknown option `{arg}` for serve"))),
        };
        let value = match inline_value {
            Some(value) => value,
            None => rest
                .next()
                .cloned()
                .ok_or_else(|| CliError(format!("option `{name}` needs a value")))?,
        };
        *slot = Some(value);
    }

    let from_env = |name: &str| env(name).filter(|value| !value.is_empty());
    let listen_text = listen
        .or_else(|| from_env("ORCHARD_AGENT_LISTEN"))
        .unwrap_or_else(|| DEFAULT_LISTEN.to_string());
    let token_file = token_file.or_else(|| from_env("ORCHARD_AGENT_TOKEN_FILE"));
    let token_value = from_env("ORCHARD_AGENT_TOKEN");
    let token = match (token_file, token_value) {
        (Some(_), Some(_)) => {
            return Err(CliError(
                "both a token file (--token-file/ORCHARD_AGENT_TOKEN_FILE) and ORCHARD_AGENT_TOKEN are set; set one".into(),
            ));
        }
        (Some(file), None) => Some(TokenSource::File(PathBuf::from(file))),
        (None, Some(value)) => Some(TokenSource::Value(value)),
        (None, None) => None,
    };
    let max_concurrent = match max_concurrent.or_else(|| from_env("ORCHARD_AGENT_MAX_CONCURRENT")) {
        Some(text) => match text.trim().parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                return Err(CliError(format!(
                    "--max-concurrent must be a positive integer, got `{text}`"
                )));
            }
        },
        None => DEFAULT_MAX_CONCURRENT,
    };
    let max_body_bytes = match max_body.or_else(|| from_env("ORCHARD_AGENT_MAX_BODY_BYTES")) {
        Some(text) => parse_size(&text).map_err(|e| CliError(format!("--max-body-bytes: {e}")))?,
        None => DEFAULT_MAX_BODY_BYTES,
    };
    let max_upload_bytes = match max_upload.or_else(|| from_env("ORCHARD_AGENT_MAX_UPLOAD_BYTES")) {
        Some(text) => {
            parse_size(&text).map_err(|e| CliError(format!("--max-upload-bytes: {e}")))?
        }
        None => DEFAULT_MAX_UPLOAD_BYTES,
    };
    Ok(ServeOptions {
        listen: parse_listen(&listen_text)?,
        token,
        root: root
            .or_else(|| from_env("ORCHARD_AGENT_ROOT"))
            .map(PathBuf::from),
        max_concurrent,
        max_body_bytes,
        max_upload_bytes,
        startup: from_env("ORCHARD_AGENT_STARTUP"),
        log_filter: from_env("ORCHARD_AGENT_LOG"),
    })
}

/// Parses a literal socket address; `:PORT` means all IPv4 interfaces. Host names are refused on purpose:
/// the static binary must never resolve names (static glibc cannot load NSS modules).
pub fn parse_listen(text: &str) -> Result<SocketAddr, CliError> {
    let text = text.trim();
    let candidate = if text.starts_with(':') {
        format!("0.0.0.0{text}")
    } else {
        text.to_string()
    };
    candidate.parse::<SocketAddr>().map_err(|_| {
        CliError(format!(
            "--listen `{text}` is not a literal socket address (examples: 0.0.0.0:9090, 127.0.0.1:0, [::]:9090, :9090); \
             host names are not resolved"
        ))
    })
}

/// Parses a byte size: `1048576`, `512K`, `16MiB`, `8G` (binary multiples).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, suffix) = trimmed.split_at(split);
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a size (examples: 1048576, 16MiB, 8G)"))?;
    let multiplier: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "unknown size suffix `{other}` in `{text}` (use K, M, G or T)"
            ));
        }
    };
    let bytes = number
        .checked_mul(multiplier)
        .ok_or_else(|| format!("size `{text}` is too large"))?;
    if bytes == 0 {
        return Err(format!("size `{text}` must be greater than zero"));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn parse_with(list: &[&str], env: &[(&str, &str)]) -> Result<Invocation, CliError> {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        parse(&args(list), &|name| env.get(name).cloned())
    }

    fn serve(list: &[&str], env: &[(&str, &str)]) -> ServeOptions {
        match parse_with(list, env) {
            Ok(Invocation::Serve(options)) => options,
            other => panic!("expected serve, got {other:?}"),
        }
    }

    #[test]
    fn serve_defaults() {
        let options = serve(&["serve"], &[]);
        assert_eq!(options.listen, "0.0.0.0:9090".parse().unwrap());
        assert_eq!(options.token, None);
        assert_eq!(options.root, None);
        assert_eq!(options.max_concurrent, 256);
        assert_eq!(options.max_body_bytes, 16 << 20);
        assert_eq!(options.max_upload_bytes, 8 << 30);
    }

    #[test]
    fn flags_beat_environment() {
        let env = [
            ("ORCHARD_AGENT_LISTEN", "127.0.0.1:1"),
            ("ORCHARD_AGENT_ROOT", "/env"),
        ];
        let options = serve(&["serve", "--listen", "127.0.0.1:2", "--root=/flag"], &env);
        assert_eq!(options.listen, "127.0.0.1:2".parse().unwrap());
        assert_eq!(options.root, Some(PathBuf::from("/flag")));
        let options = serve(&["serve"], &env);
        assert_eq!(options.listen, "127.0.0.1:1".parse().unwrap());
        assert_eq!(options.root, Some(PathBuf::from("/env")));
    }

    #[test]
    fn token_sources() {
        let options = serve(&["serve", "--token-file", "/t"], &[]);
        assert_eq!(options.token, Some(TokenSource::File("/t".into())));
        let options = serve(&["serve"], &[("ORCHARD_AGENT_TOKEN", "secret")]);
        assert_eq!(options.token, Some(TokenSource::Value("secret".into())));
        let options = serve(&["serve"], &[("ORCHARD_AGENT_TOKEN_FILE", "/f")]);
        assert_eq!(options.token, Some(TokenSource::File("/f".into())));
        assert!(
            parse_with(
                &["serve", "--token-file", "/t"],
                &[("ORCHARD_AGENT_TOKEN", "x")]
            )
            .is_err()
        );
    }

    #[test]
    fn limits_and_sizes() {
        let options = serve(
            &[
                "serve",
                "--max-concurrent",
                "4",
                "--max-body-bytes",
                "1K",
                "--max-upload-bytes=2MiB",
            ],
            &[],
        );
        assert_eq!(
            (
                options.max_concurrent,
                options.max_body_bytes,
                options.max_upload_bytes
            ),
            (4, 1024, 2 << 20)
        );
        assert!(parse_with(&["serve", "--max-concurrent", "0"], &[]).is_err());
        assert!(parse_with(&["serve", "--max-body-bytes", "lots"], &[]).is_err());
        assert_eq!(parse_size("8G"), Ok(8 << 30));
        assert_eq!(parse_size("100"), Ok(100));
        assert!(parse_size("3X").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("99999999999999T").is_err());
    }

    #[test]
    fn listen_is_literal_only() {
        assert_eq!(
            parse_listen(":8080").unwrap(),
            "0.0.0.0:8080".parse().unwrap()
        );
        assert_eq!(parse_listen("[::1]:9").unwrap(), "[::1]:9".parse().unwrap());
        assert!(parse_listen("localhost:9090").is_err());
    }

    #[test]
    fn other_subcommands() {
        assert_eq!(parse_with(&["--version"], &[]), Ok(Invocation::Version));
        assert_eq!(
            parse_with(&["install", "/opt/orchard"], &[]),
            Ok(Invocation::Install {
                dir: "/opt/orchard".into()
            })
        );
        assert!(parse_with(&["install"], &[]).is_err());
        assert!(parse_with(&[], &[]).is_err());
        assert!(parse_with(&["serve", "--bogus"], &[]).is_err());
        assert!(parse_with(&["serve", "--listen"], &[]).is_err());
        assert!(parse_with(&["frobnicate"], &[]).is_err());
        assert_eq!(parse_with(&["--help"], &[]), Ok(Invocation::Help));
    }

    #[test]
    fn startup_and_log_come_from_env() {
        let options = serve(
            &["serve"],
            &[
                ("ORCHARD_AGENT_STARTUP", "{\"argv\":[\"x\"]}"),
                ("ORCHARD_AGENT_LOG", "debug"),
            ],
        );
        assert_eq!(options.startup.as_deref(), Some("{\"argv\":[\"x\"]}"));
        assert_eq!(options.log_filter.as_deref(), Some("debug"));
    }
}
