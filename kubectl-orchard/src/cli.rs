//! The command line: `kubectl orchard [--gateway URL] [--token T] [-n NS] <command> ...`.

use clap::{Args, Parser, Subcommand};

use crate::settings::Flags;

/// Work with Orchard Env sandboxes through the gateway: exec, shell, cp, port-forward, wait, extend,
/// metrics.
#[derive(Debug, Parser)]
#[command(name = "kubectl-orchard", bin_name = "kubectl orchard", version)]
pub struct Cli {
    /// Connection settings.
    #[command(flatten)]
    pub connection: Connection,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Connection flags (each falls back to an environment variable, then the kubeconfig).
#[derive(Debug, Args)]
pub struct Connection {
    /// Gateway URL [env: ORCHARD_GATEWAY_URL; default: the in-cluster Service]
    #[arg(long, global = true)]
    pub gateway: Option<String>,
    /// Bearer token [env: ORCHARD_TOKEN or ORCHARD_TOKEN_FILE; default: the kubeconfig user's]
    #[arg(long, global = true)]
    pub token: Option<String>,
    /// Namespace [env: ORCHARD_NAMESPACE; default: the kubeconfig context's, else `default`]
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
}

impl Connection {
    /// The flags as settings input.
    pub fn flags(&self) -> Flags {
        Flags {
            gateway: self.gateway.clone(),
            token: self.token.clone(),
            namespace: self.namespace.clone(),
        }
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command in a sandbox; exits with its exit status (124 when it timed out).
    Exec(ExecArgs),
    /// An interactive shell session: each line of standard input runs in one persistent shell.
    Shell(ShellArgs),
    /// Copy files or directories: `cp ./dir SANDBOX:/path` or `cp SANDBOX:/path ./dir`.
    Cp(CpArgs),
    /// Forward a local port to a port on the sandbox's loopback: `LOCAL:REMOTE` or `PORT`.
    PortForward(PortForwardArgs),
    /// Wait until a sandbox is Ready.
    Wait(WaitArgs),
    /// End a Ready sandbox SECONDS from now (longer or shorter).
    Extend(ExtendArgs),
    /// Show a sandbox's resource usage (CPU, memory, processes, disk) as JSON.
    Metrics(MetricsArgs),
}

/// `exec SANDBOX [--user U] [--timeout S] [--cwd D] [--env K=V] -- CMD ARGS...`
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The sandbox.
    pub sandbox: String,
    /// Run as this user (name or uid[:gid]).
    #[arg(long)]
    pub user: Option<String>,
    /// Kill the command after this many seconds (the agent's default: 600).
    #[arg(long)]
    pub timeout: Option<u64>,
    /// Working directory.
    #[arg(long)]
    pub cwd: Option<String>,
    /// Environment variable, `NAME=VALUE` (repeatable).
    #[arg(long = "env", short = 'e', value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// `shell SANDBOX [--user U] [--timeout S]`
#[derive(Debug, Args)]
pub struct ShellArgs {
    /// The sandbox.
    pub sandbox: String,
    /// Run the shell as this user.
    #[arg(long)]
    pub user: Option<String>,
    /// Interrupt a line's command after this many seconds (the session stays usable).
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
}

/// `cp SRC DST`
#[derive(Debug, Args)]
pub struct CpArgs {
    /// Source: a local path or `SANDBOX:PATH`.
    pub src: String,
    /// Destination: a local path or `SANDBOX:PATH`.
    pub dst: String,
}

/// `port-forward SANDBOX [LOCAL:]REMOTE`
#[derive(Debug, Args)]
pub struct PortForwardArgs {
    /// The sandbox.
    pub sandbox: String,
    /// `LOCAL:REMOTE`, or `PORT` for the same port on both sides.
    pub ports: String,
    /// Local address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub address: std::net::IpAddr,
}

/// `wait SANDBOX [--timeout S]`
#[derive(Debug, Args)]
pub struct WaitArgs {
    /// The sandbox.
    pub sandbox: String,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
}

/// `extend SANDBOX SECONDS`
#[derive(Debug, Args)]
pub struct ExtendArgs {
    /// The sandbox.
    pub sandbox: String,
    /// Seconds from now until the sandbox ends.
    pub seconds: u64,
}

/// `metrics SANDBOX`
#[derive(Debug, Args)]
pub struct MetricsArgs {
    /// The sandbox.
    pub sandbox: String,
}

/// `NAME=VALUE` (pure).
pub fn parse_env(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_string(), value.to_string())),
        _ => Err(format!("`{text}` is not NAME=VALUE")),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("kubectl-orchard").chain(args.iter().copied()))
    }

    #[test]
    fn the_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn exec_takes_the_command_after_dashes() {
        let cli = parse(&[
            "-n",
            "rl",
            "exec",
            "s1",
            "--timeout",
            "5",
            "-e",
            "A=1=2",
            "--",
            "sh",
            "-c",
            "exit 3",
        ])
        .unwrap();
        assert_eq!(cli.connection.namespace.as_deref(), Some("rl"));
        let Command::Exec(exec) = cli.command else {
            panic!("not exec");
        };
        assert_eq!(exec.sandbox, "s1");
        assert_eq!(exec.timeout, Some(5));
        assert_eq!(exec.env, vec![("A".to_string(), "1=2".to_string())]);
        assert_eq!(exec.command, ["sh", "-c", "exit 3"]);
        // The command needs `--` and at least one word.
        assert!(parse(&["exec", "s1"]).is_err());
        assert!(parse(&["exec", "s1", "ls"]).is_err());
    }

    #[test]
    fn namespace_may_follow_the_subcommand() {
        let cli = parse(&["wait", "s1", "-n", "rl", "--timeout", "9"]).unwrap();
        assert_eq!(cli.connection.namespace.as_deref(), Some("rl"));
        let Command::Wait(wait) = cli.command else {
            panic!("not wait");
        };
        assert_eq!(wait.timeout, 9);
    }

    #[test]
    fn env_pairs() {
        assert_eq!(parse_env("A=").unwrap(), ("A".into(), String::new()));
        assert!(parse_env("=x").is_err());
        assert!(parse_env("A").is_err());
    }
}
