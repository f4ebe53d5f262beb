//! Command-line and environment parsing for `orchard-agent` (hand-written: no parser dependency keeps the
//! binary small). Pure: the environment is passed in as a lookup function so every rule is unit-tested.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::auth::TokenSource;

/// Default address the server binds to: all interfaces of both families (the gateway reaches the
/// agent at the Pod IP, IPv4 or IPv6); see `listen` for the dual-stack socket and its IPv4 fallback.
pub const DEFAULT_LISTEN: &str = "[::]:9090";
/// Default cap on in-flight `/v1` requests before the agent answers 429.
pub const DEFAULT_MAX_CONCURRENT: usize = 256;
/// Default cap on JSON request bodies.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 16 * 1024 * 1024;
/// Default cap on one uploaded file.
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 8 * 1024 * 1024 * 1024;
/// Default cap on the output buffered by all execs and background processes together.
pub const DEFAULT_MAX_OUTPUT_BYTES_TOTAL: u64 = 256 * 1024 * 1024;
/// Default time a connection has to send a complete request head (also closes idle kept-alive ones).
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default cap on open connections (at the cap the longest-waiting idle connection is closed).
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// Prefix of every environment variable the agent reads; all of them are scrubbed from children's env.
pub const ENV_PREFIX: &str = "ORCHARD_AGENT_";
/// The environment variable that may carry the token itself (wiped from the environment block at start).
pub const TOKEN_VARIABLE: &str = "ORCHARD_AGENT_TOKEN";
/// The environment variable that may carry the token verifier: the token's SHA-256 in hex (what the
/// operator puts in the pod spec). Wiped from the environment block at start like the token.
pub const TOKEN_SHA256_VARIABLE: &str = "ORCHARD_AGENT_TOKEN_SHA256";
/// Variables whose values `serve` overwrites in its environment block at start (so
/// `/proc/<pid>/environ` does not show them), before removing every `ORCHARD_AGENT_*` variable.
pub const WIPED_VARIABLES: &[&str] = &[TOKEN_VARIABLE, TOKEN_SHA256_VARIABLE];

pub const USAGE: &str = "\
usage:
  orchard-agent serve [--listen ADDR] [--token-file PATH | --token-sha256 HEX] [--root DIR]
                      [--max-concurrent N] [--max-body-bytes SIZE] [--max-upload-bytes SIZE]
                      [--max-output-bytes-total SIZE] [--header-read-timeout DURATION]
                      [--max-connections N] [--egress-canary ADDR[,ADDR]] [--insecure-no-auth]
  orchard-agent install DIR
                       copy this executable to DIR/orchard-agent (mode 0755) and print the path
  orchard-agent --version
  orchard-agent --help

serve options (flag, then environment variable, then default):
  --listen ADDR            ORCHARD_AGENT_LISTEN          literal socket address, default [::]:9090: IPv6 and IPv4
                           (0.0.0.0:9090 where there is no IPv6); :PORT means [::]:PORT
  --token-file PATH        ORCHARD_AGENT_TOKEN_FILE      file holding the bearer token (or ORCHARD_AGENT_TOKEN=value)
  --token-sha256 HEX       ORCHARD_AGENT_TOKEN_SHA256    accept the bearer token whose SHA-256 is HEX (64 hex digits);
                           give exactly one of token file, token value and token verifier
  --root DIR               ORCHARD_AGENT_ROOT            default cwd and base of relative paths, default: current dir
  --max-concurrent N       ORCHARD_AGENT_MAX_CONCURRENT  in-flight /v1 requests before 429, default 256
  --max-body-bytes SIZE    ORCHARD_AGENT_MAX_BODY_BYTES  JSON body limit, default 16MiB
  --max-upload-bytes SIZE  ORCHARD_AGENT_MAX_UPLOAD_BYTES  uploaded file limit, default 8GiB
  --max-output-bytes-total SIZE  ORCHARD_AGENT_MAX_OUTPUT_BYTES_TOTAL  output buffered by all commands, default 256MiB
  --header-read-timeout DURATION  ORCHARD_AGENT_HEADER_READ_TIMEOUT  time a connection has to send a request head,
                           also the idle time after which a kept-alive connection closes, default 10s
  --max-connections N      ORCHARD_AGENT_MAX_CONNECTIONS  open connections; at the cap the one waiting longest for a
                           request head is closed to make room, default 1024
  --egress-canary ADDRS    ORCHARD_AGENT_EGRESS_CANARY   socket addresses (comma-separated) this sandbox's NetworkPolicies deny:
                           serve nothing (503, the startup command waits) until a TCP connection to each fails
  --insecure-no-auth       ORCHARD_AGENT_INSECURE_NO_AUTH=true    serve without a token: LOCAL DEBUGGING ONLY, anyone who
                           can reach the port runs commands (serve refuses to start without a token otherwise)
  ORCHARD_AGENT_STARTUP    JSON {\"argv\":[..]} or {\"command\":\"..\"}: background process `startup` at boot
  ORCHARD_AGENT_LOG        log filter (error|warn|info|debug|trace, or target=level,...), default info
  ORCHARD_AGENT_DIE_WITH_PARENT  pid of the expected parent: exit when it exits (supervisors other than a container runtime)
SIZE accepts a byte count or a suffix: K, M, G (also KiB, MiB, GiB; all powers of 1024).
DURATION accepts seconds or a suffix: ms, s, m (10s, 500ms, 2m).";

/// What the command line asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    /// Boxed: the options are much larger than the other variants.
    Serve(Box<ServeOptions>),
    Install {
        dir: PathBuf,
    },
    Version,
    Help,
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
    /// Cap on the output buffered by all execs and background processes together.
    pub max_output_bytes_total: u64,
    /// Time a connection has to send a complete request head.
    pub header_read_timeout: Duration,
    /// Cap on open connections.
    pub max_connections: usize,
    /// `--insecure-no-auth`: serve without a token (local debugging only). `token` is then `None`.
    pub insecure_no_auth: bool,
    /// Addresses the sandbox's NetworkPolicies deny: nothing is served until none accepts a
    /// connection (`policy_gate`). Empty: serve at once.
    pub egress_canaries: Vec<SocketAddr>,
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
        "install" => parse_install(&args[1..]),
        "serve" => parse_serve(&args[1..], env).map(|options| Invocation::Serve(Box::new(options))),
        other => Err(CliError(format!(
            "unknown subcommand `{other}` (expected serve, install or --version)"
        ))),
    }
}

/// An option's name and, for `--name=value`, its inline value.
fn split_option(arg: &str) -> (&str, Option<String>) {
    match arg.split_once('=') {
        Some((name, value)) if name.starts_with("--") => (name, Some(value.to_string())),
        _ => (arg, None),
    }
}

/// The value of option `name`: inline (`--name=value`) or the next argument.
fn option_value<'a>(
    name: &str,
    inline_value: Option<String>,
    rest: &mut impl Iterator<Item = &'a String>,
) -> Result<String, CliError> {
    match inline_value {
        Some(value) => Ok(value),
        None => rest
            .next()
            .cloned()
            .ok_or_else(|| CliError(format!("option `{name}` needs a value"))),
    }
}

/// `install DIR`.
fn parse_install(args: &[String]) -> Result<Invocation, CliError> {
    let usage = || CliError("usage: orchard-agent install DIR".into());
    let Some((dir, rest)) = args.split_first() else {
        return Err(usage());
    };
    if dir.starts_with('-') {
        return Err(usage());
    }
    if let Some(arg) = rest.first() {
        return Err(CliError(format!("unknown option `{arg}` for install")));
    }
    Ok(Invocation::Install {
        dir: PathBuf::from(dir),
    })
}

/// A boolean environment variable: `true`/`1`/`yes` or `false`/`0`/`no` (case-insensitive).
fn parse_bool(name: &str, text: &str) -> Result<bool, CliError> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(CliError(format!(
            "{name} must be true or false, got `{text}`"
        ))),
    }
}

fn parse_serve(
    args: &[String],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ServeOptions, CliError> {
    let mut listen = None;
    let mut token_file = None;
    let mut token_sha256 = None;
    let mut root = None;
    let mut max_concurrent = None;
    let mut max_body = None;
    let mut max_upload = None;
    let mut max_output_total = None;
    let mut header_read_timeout = None;
    let mut max_connections = None;
    let mut egress_canary = None;
    let mut insecure_no_auth = false;

    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if arg == "--help" || arg == "-h" {
            return Err(CliError("serve takes only the options below".into()));
        }
        if arg == "--insecure-no-auth" {
            insecure_no_auth = true;
            continue;
        }
        let (name, inline_value) = split_option(arg);
        let slot = match name {
            "--listen" => &mut listen,
            "--token-file" => &mut token_file,
            "--token-sha256" => &mut token_sha256,
            "--root" => &mut root,
            "--max-concurrent" => &mut max_concurrent,
            "--max-body-bytes" => &mut max_body,
            "--max-upload-bytes" => &mut max_upload,
            "--max-output-bytes-total" => &mut max_output_total,
            "--header-read-timeout" => &mut header_read_timeout,
            "--max-connections" => &mut max_connections,
            "--egress-canary" => &mut egress_canary,
            _ => return Err(CliError(format!("unknown option `{arg}` for serve"))),
        };
        *slot = Some(option_value(name, inline_value, &mut rest)?);
    }

    let from_env = |name: &str| env(name).filter(|value| !value.is_empty());
    let listen_text = listen
        .or_else(|| from_env("ORCHARD_AGENT_LISTEN"))
        .unwrap_or_else(|| DEFAULT_LISTEN.to_string());
    let token = token_source(
        token_file.or_else(|| from_env("ORCHARD_AGENT_TOKEN_FILE")),
        from_env(TOKEN_VARIABLE),
        token_sha256.or_else(|| from_env(TOKEN_SHA256_VARIABLE)),
    )?;
    if let Some(text) = from_env("ORCHARD_AGENT_INSECURE_NO_AUTH") {
        insecure_no_auth |= parse_bool("ORCHARD_AGENT_INSECURE_NO_AUTH", &text)?;
    }
    check_auth_choice(token.as_ref(), insecure_no_auth)?;
    let max_concurrent = match max_concurrent.or_else(|| from_env("ORCHARD_AGENT_MAX_CONCURRENT")) {
        Some(text) => parse_count("--max-concurrent", &text)?,
        None => DEFAULT_MAX_CONCURRENT,
    };
    let max_connections =
        match max_connections.or_else(|| from_env("ORCHARD_AGENT_MAX_CONNECTIONS")) {
            Some(text) => parse_count("--max-connections", &text)?,
            None => DEFAULT_MAX_CONNECTIONS,
        };
    let header_read_timeout =
        match header_read_timeout.or_else(|| from_env("ORCHARD_AGENT_HEADER_READ_TIMEOUT")) {
            Some(text) => parse_duration(&text)
                .map_err(|error| CliError(format!("--header-read-timeout: {error}")))?,
            None => DEFAULT_HEADER_READ_TIMEOUT,
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
    let max_output_bytes_total =
        match max_output_total.or_else(|| from_env("ORCHARD_AGENT_MAX_OUTPUT_BYTES_TOTAL")) {
            Some(text) => {
                parse_size(&text).map_err(|e| CliError(format!("--max-output-bytes-total: {e}")))?
            }
            None => DEFAULT_MAX_OUTPUT_BYTES_TOTAL,
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
        max_output_bytes_total,
        header_read_timeout,
        max_connections,
        insecure_no_auth,
        egress_canaries: match egress_canary.or_else(|| from_env("ORCHARD_AGENT_EGRESS_CANARY")) {
            Some(text) => parse_canaries(&text)?,
            None => Vec::new(),
        },
        startup: from_env("ORCHARD_AGENT_STARTUP"),
        log_filter: from_env("ORCHARD_AGENT_LOG"),
    })
}

/// The one token source among a token file, a token value and a token verifier (flag or environment,
/// already merged); two at once are refused, naming both.
fn token_source(
    file: Option<String>,
    value: Option<String>,
    sha256: Option<String>,
) -> Result<Option<TokenSource>, CliError> {
    let given: Vec<&str> = [
        (
            file.is_some(),
            "a token file (--token-file/ORCHARD_AGENT_TOKEN_FILE)",
        ),
        (value.is_some(), "a token value (ORCHARD_AGENT_TOKEN)"),
        (
            sha256.is_some(),
            "a token verifier (--token-sha256/ORCHARD_AGENT_TOKEN_SHA256)",
        ),
    ]
    .into_iter()
    .filter_map(|(set, name)| set.then_some(name))
    .collect();
    if given.len() > 1 {
        return Err(CliError(format!(
            "{} are set at once; set exactly one",
            given.join(" and ")
        )));
    }
    if let Some(file) = file {
        return Ok(Some(TokenSource::File(PathBuf::from(file))));
    }
    if let Some(value) = value {
        return Ok(Some(TokenSource::Value(value)));
    }
    match sha256 {
        Some(hex) => crate::auth::parse_sha256_hex(&hex)
            .map(|digest| Some(TokenSource::Sha256(digest)))
            .map_err(|error| {
                CliError(format!("--token-sha256 ({TOKEN_SHA256_VARIABLE}): {error}"))
            }),
        None => Ok(None),
    }
}

/// The token rules of `serve`: a token is required unless `--insecure-no-auth` says otherwise (and then
/// none may be given, so the choice is never ambiguous).
pub fn check_auth_choice(
    token: Option<&TokenSource>,
    insecure_no_auth: bool,
) -> Result<(), CliError> {
    match (token, insecure_no_auth) {
        (None, false) => Err(CliError(
            "no bearer token: set --token-file PATH (ORCHARD_AGENT_TOKEN_FILE), ORCHARD_AGENT_TOKEN or \
             --token-sha256 HEX (ORCHARD_AGENT_TOKEN_SHA256); \
             to serve without authentication for local debugging only, pass --insecure-no-auth"
                .into(),
        )),
        (Some(_), true) => Err(CliError(
            "--insecure-no-auth (ORCHARD_AGENT_INSECURE_NO_AUTH) and a token are both set; set one".into(),
        )),
        _ => Ok(()),
    }
}

/// Parses a literal socket address; `:PORT` means all interfaces, like the default (`[::]:PORT`,
/// dual-stack). Host names are refused on purpose: the static binary must never resolve names (static
/// glibc cannot load NSS modules).
pub fn parse_listen(text: &str) -> Result<SocketAddr, CliError> {
    let text = text.trim();
    let candidate = if text.starts_with(':') {
        format!("[::]{text}")
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

/// Parses `--egress-canary`: literal socket addresses, comma-separated (blanks between commas ignored).
pub fn parse_canaries(text: &str) -> Result<Vec<SocketAddr>, CliError> {
    text.split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(|part| {
            part.parse::<SocketAddr>().map_err(|_| {
                CliError(format!(
                    "--egress-canary `{part}` is not a literal socket address (examples: 10.0.0.1:6443, [fd00::1]:6443)"
                ))
            })
        })
        .collect()
}

/// A positive integer option (`name` for the message).
fn parse_count(name: &str, text: &str) -> Result<usize, CliError> {
    match text.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(CliError(format!(
            "{name} must be a positive integer, got `{text}`"
        ))),
    }
}

/// Parses a duration: `10` (seconds), `10s`, `500ms`, `2m`; at least one millisecond.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, suffix) = trimmed.split_at(split);
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (examples: 10s, 500ms, 2m)"))?;
    let milliseconds_per_unit: u64 = match suffix.trim() {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        other => {
            return Err(format!(
                "unknown duration unit `{other}` in `{text}` (use ms, s or m)"
            ));
        }
    };
    let milliseconds = number
        .checked_mul(milliseconds_per_unit)
        .ok_or_else(|| format!("duration `{text}` is too long"))?;
    if milliseconds == 0 {
        return Err(format!("duration `{text}` must be greater than zero"));
    }
    Ok(Duration::from_millis(milliseconds))
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
            Ok(Invocation::Serve(options)) => *options,
            other => panic!("expected serve, got {other:?}"),
        }
    }

    /// A token in the environment: `serve` refuses to start without one.
    const TOKEN: (&str, &str) = ("ORCHARD_AGENT_TOKEN", "t");

    #[test]
    fn serve_defaults() {
        let options = serve(&["serve"], &[TOKEN]);
        assert_eq!(options.listen, "[::]:9090".parse().unwrap());
        assert_eq!(options.token, Some(TokenSource::Value("t".into())));
        assert_eq!(options.root, None);
        assert_eq!(options.max_concurrent, 256);
        assert_eq!(options.max_body_bytes, 16 << 20);
        assert_eq!(options.max_upload_bytes, 8 << 30);
        assert_eq!(options.max_output_bytes_total, 256 << 20);
        assert_eq!(options.header_read_timeout, Duration::from_secs(10));
        assert_eq!(options.max_connections, 1024);
        assert!(!options.insecure_no_auth);
        assert!(options.egress_canaries.is_empty());
    }

    #[test]
    fn egress_canaries_come_from_the_flag_or_the_environment() {
        let from_env = serve(
            &["serve"],
            &[
                TOKEN,
                (
                    "ORCHARD_AGENT_EGRESS_CANARY",
                    "10.0.0.1:6443, [fd00::1]:6443,",
                ),
            ],
        );
        assert_eq!(
            from_env.egress_canaries,
            vec![
                "10.0.0.1:6443".parse().unwrap(),
                "[fd00::1]:6443".parse().unwrap()
            ]
        );
        let flag = serve(
            &["serve", "--egress-canary=10.0.0.2:443"],
            &[TOKEN, ("ORCHARD_AGENT_EGRESS_CANARY", "10.0.0.1:6443")],
        );
        assert_eq!(flag.egress_canaries, vec!["10.0.0.2:443".parse().unwrap()]);
        let error = parse_with(&["serve", "--egress-canary", "api:6443"], &[TOKEN]).unwrap_err();
        assert!(error.0.contains("`api:6443`"), "{error}");
    }

    #[test]
    fn serve_refuses_to_start_without_a_token() {
        let error = parse_with(&["serve"], &[]).unwrap_err();
        assert!(error.0.contains("--insecure-no-auth"), "{error}");
        assert!(error.0.contains("no bearer token"), "{error}");
        // Empty values do not count as a token.
        assert!(parse_with(&["serve"], &[("ORCHARD_AGENT_TOKEN", "")]).is_err());
    }

    #[test]
    fn insecure_no_auth_is_explicit() {
        let options = serve(&["serve", "--insecure-no-auth"], &[]);
        assert!(options.insecure_no_auth);
        assert_eq!(options.token, None);
        let options = serve(&["serve"], &[("ORCHARD_AGENT_INSECURE_NO_AUTH", "true")]);
        assert!(options.insecure_no_auth);
        assert!(parse_with(&["serve"], &[("ORCHARD_AGENT_INSECURE_NO_AUTH", "false")]).is_err());
        assert!(parse_with(&["serve"], &[("ORCHARD_AGENT_INSECURE_NO_AUTH", "maybe")]).is_err());
        // A token and --insecure-no-auth together are ambiguous: refused.
        assert!(parse_with(&["serve", "--insecure-no-auth"], &[TOKEN]).is_err());
        assert!(parse_with(&["serve", "--insecure-no-auth=yes"], &[]).is_err());
    }

    /// SHA-256 of `abc`.
    const ABC_SHA256: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    #[test]
    fn token_verifier_from_flag_or_environment() {
        let digest = crate::auth::sha256(b"abc");
        let options = serve(&["serve", "--token-sha256", ABC_SHA256], &[]);
        assert_eq!(options.token, Some(TokenSource::Sha256(digest)));
        assert!(!options.insecure_no_auth);
        let options = serve(&["serve"], &[(TOKEN_SHA256_VARIABLE, ABC_SHA256)]);
        assert_eq!(options.token, Some(TokenSource::Sha256(digest)));
        // Upper case is normalised; the flag beats the variable.
        let upper = ABC_SHA256.to_ascii_uppercase();
        let options = serve(&["serve", &format!("--token-sha256={upper}")], &[]);
        assert_eq!(options.token, Some(TokenSource::Sha256(digest)));
        let other = "00".repeat(32);
        let options = serve(
            &["serve", "--token-sha256", &other],
            &[(TOKEN_SHA256_VARIABLE, ABC_SHA256)],
        );
        assert_eq!(options.token, Some(TokenSource::Sha256([0; 32])));
    }

    #[test]
    fn token_verifier_must_be_64_hex_characters() {
        for bad in [
            &ABC_SHA256[..63],
            &format!("{ABC_SHA256}a"),
            &format!("z{}", &ABC_SHA256[1..]),
            "abc",
            "",
        ] {
            let error = parse_with(&["serve", "--token-sha256", bad], &[]).unwrap_err();
            assert!(error.0.contains("--token-sha256"), "{bad:?}: {error}");
            assert!(error.0.contains("hex"), "{bad:?}: {error}");
            if !bad.is_empty() {
                let error = parse_with(&["serve"], &[(TOKEN_SHA256_VARIABLE, bad)]).unwrap_err();
                assert!(error.0.contains(TOKEN_SHA256_VARIABLE), "{bad:?}: {error}");
            }
        }
        // An empty variable counts as unset, like the other variables: then there is no token.
        let error = parse_with(&["serve"], &[(TOKEN_SHA256_VARIABLE, "")]).unwrap_err();
        assert!(error.0.contains("no bearer token"), "{error}");
        assert!(error.0.contains("--token-sha256"), "{error}");
        assert!(parse_with(&["serve", "--token-sha256"], &[]).is_err());
    }

    #[test]
    fn two_token_sources_are_refused_naming_both() {
        let verifier = (TOKEN_SHA256_VARIABLE, ABC_SHA256);
        let refused = |list: &[&str], env: &[(&str, &str)], named: [&str; 2]| {
            let error = parse_with(list, env).unwrap_err();
            for name in named {
                assert!(error.0.contains(name), "{list:?} {env:?}: {error}");
            }
            assert!(error.0.contains("set exactly one"), "{error}");
        };
        refused(
            &["serve", "--token-sha256", ABC_SHA256],
            &[TOKEN],
            ["ORCHARD_AGENT_TOKEN)", "--token-sha256"],
        );
        refused(
            &["serve"],
            &[TOKEN, verifier],
            ["ORCHARD_AGENT_TOKEN)", "ORCHARD_AGENT_TOKEN_SHA256"],
        );
        refused(
            &["serve", "--token-file", "/t"],
            &[verifier],
            ["--token-file", "--token-sha256"],
        );
        refused(
            &["serve"],
            &[("ORCHARD_AGENT_TOKEN_FILE", "/t"), verifier],
            ["ORCHARD_AGENT_TOKEN_FILE", "ORCHARD_AGENT_TOKEN_SHA256"],
        );
        refused(
            &["serve", "--token-file", "/t"],
            &[TOKEN],
            ["--token-file", "ORCHARD_AGENT_TOKEN)"],
        );
        // A bad verifier beside another source: the conflict is what is reported.
        let error = parse_with(&["serve", "--token-sha256", "xyz"], &[TOKEN]).unwrap_err();
        assert!(error.0.contains("set exactly one"), "{error}");
        // A verifier is a token: not together with --insecure-no-auth.
        assert!(parse_with(&["serve", "--insecure-no-auth"], &[verifier]).is_err());
    }

    #[test]
    fn token_variables_are_wiped_and_scrubbed() {
        // main wipes these values from /proc/<pid>/environ, then removes every ORCHARD_AGENT_* variable.
        assert!(WIPED_VARIABLES.contains(&TOKEN_VARIABLE));
        assert!(WIPED_VARIABLES.contains(&TOKEN_SHA256_VARIABLE));
        assert!(
            WIPED_VARIABLES
                .iter()
                .all(|name| name.starts_with(ENV_PREFIX))
        );
    }

    #[test]
    fn the_token_hand_over_is_gone() {
        for list in [
            &["serve", "--token-file", "/t", "--consume-token-file"][..],
            &["install", "/d", "--token-from", "/a", "--token-to", "/b"],
            &["install", "/d", "--token-to=/b"],
        ] {
            let error = parse_with(list, &[]).unwrap_err();
            assert!(
                error.0.starts_with("unknown option `--"),
                "{list:?}: {error}"
            );
        }
        // The variable is not read any more (and, like every ORCHARD_AGENT_* variable, scrubbed).
        let options = serve(
            &["serve"],
            &[TOKEN, ("ORCHARD_AGENT_CONSUME_TOKEN_FILE", "true")],
        );
        assert_eq!(options.token, Some(TokenSource::Value("t".into())));
    }

    #[test]
    fn flags_beat_environment() {
        let env = [
            ("ORCHARD_AGENT_LISTEN", "127.0.0.1:1"),
            ("ORCHARD_AGENT_ROOT", "/env"),
            TOKEN,
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
                "--max-output-bytes-total",
                "3M",
            ],
            &[TOKEN],
        );
        assert_eq!(options.max_output_bytes_total, 3 << 20);
        assert_eq!(
            (
                options.max_concurrent,
                options.max_body_bytes,
                options.max_upload_bytes
            ),
            (4, 1024, 2 << 20)
        );
        assert!(parse_with(&["serve", "--max-concurrent", "0"], &[TOKEN]).is_err());
        assert!(parse_with(&["serve", "--max-body-bytes", "lots"], &[TOKEN]).is_err());
        assert!(parse_with(&["serve", "--max-output-bytes-total", "0"], &[TOKEN]).is_err());
        assert_eq!(parse_size("8G"), Ok(8 << 30));
        assert_eq!(parse_size("100"), Ok(100));
        assert!(parse_size("3X").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("99999999999999T").is_err());
    }

    #[test]
    fn connection_limits_come_from_flags_or_the_environment() {
        let env = [
            TOKEN,
            ("ORCHARD_AGENT_HEADER_READ_TIMEOUT", "500ms"),
            ("ORCHARD_AGENT_MAX_CONNECTIONS", "64"),
        ];
        let options = serve(&["serve"], &env);
        assert_eq!(options.header_read_timeout, Duration::from_millis(500));
        assert_eq!(options.max_connections, 64);
        let options = serve(
            &[
                "serve",
                "--header-read-timeout=2m",
                "--max-connections",
                "8",
            ],
            &env,
        );
        assert_eq!(options.header_read_timeout, Duration::from_secs(120));
        assert_eq!(options.max_connections, 8);
        for (flag, bad) in [
            ("--header-read-timeout", "0"),
            ("--header-read-timeout", "soon"),
            ("--header-read-timeout", "5h"),
            ("--max-connections", "0"),
            ("--max-connections", "-1"),
        ] {
            let error = parse_with(&["serve", flag, bad], &[TOKEN]).unwrap_err();
            assert!(error.0.contains(flag), "{flag} {bad}: {error}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration(" 10s "), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("3m"), Ok(Duration::from_secs(180)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("1.5s").is_err());
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("99999999999999999m").is_err());
    }

    #[test]
    fn listen_is_literal_only() {
        assert_eq!(parse_listen(":8080").unwrap(), "[::]:8080".parse().unwrap());
        assert_eq!(
            parse_listen("0.0.0.0:8080").unwrap(),
            "0.0.0.0:8080".parse().unwrap(),
            "an explicit IPv4 address stays IPv4 only"
        );
        assert_eq!(parse_listen("[::]:0").unwrap(), "[::]:0".parse().unwrap());
        assert_eq!(parse_listen("[::1]:9").unwrap(), "[::1]:9".parse().unwrap());
        assert!(parse_listen("localhost:9090").is_err());
    }

    #[test]
    fn other_subcommands() {
        assert_eq!(parse_with(&["--version"], &[]), Ok(Invocation::Version));
        assert_eq!(
            parse_with(&["install", "/opt/orchard"], &[]),
            Ok(Invocation::Install {
                dir: "/opt/orchard".into(),
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
                TOKEN,
            ],
        );
        assert_eq!(options.startup.as_deref(), Some("{\"argv\":[\"x\"]}"));
        assert_eq!(options.log_filter.as_deref(), Some("debug"));
    }
}
