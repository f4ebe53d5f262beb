//! `kubectl-orchard`, the `kubectl orchard` plugin: exec, shell, cp, port-forward, wait, extend and
//! metrics for Orchard Env sandboxes, through the gateway (docs/KUBECTL.md).

mod cli;
mod commands;
mod error;
mod gateway;
mod kubeconfig;
mod settings;
mod stream_io;
mod tar_stream;
mod tunnel;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};
use crate::error::Result;
use crate::gateway::Gateway;
use crate::settings::Settings;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(run(cli));
    // A read of standard input may still be blocked in a runtime thread (after Ctrl-C): do not wait.
    runtime.shutdown_background();
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            eprintln!("{}", error.line());
            ExitCode::from(error.exit_code())
        }
    }
}

/// Resolves the settings and runs the subcommand; the process exit status.
async fn run(cli: Cli) -> Result<u8> {
    let gateway = Gateway::new(&settings(&cli).await?)?;
    match cli.command {
        Command::Exec(args) => commands::exec::run(&gateway, args).await,
        Command::Shell(args) => commands::shell::run(&gateway, args).await,
        Command::Cp(args) => commands::cp::run(&gateway, args).await,
        Command::PortForward(args) => commands::port_forward::run(&gateway, args).await,
        Command::Wait(args) => commands::wait::run(&gateway, args).await,
        Command::Extend(args) => commands::extend::run(&gateway, args).await,
        Command::Metrics(args) => commands::metrics::run(&gateway, args).await,
    }
}

/// Flags, environment, then the kubeconfig (read only when a token or namespace is still missing).
async fn settings(cli: &Cli) -> Result<Settings> {
    let flags = cli.connection.flags();
    let env = |key: &str| std::env::var(key).ok();
    let kube = if settings::needs_kubeconfig(&flags, &env) {
        Some(kubeconfig::load().await)
    } else {
        None
    };
    settings::resolve(&flags, &env, kube.as_ref(), &settings::service_account())
}
