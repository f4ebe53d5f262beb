//! Entry point of `orchard-agent`: parse the command line, then serve (behind a PID 1 init when the
//! agent is PID 1), install, or print the version.

use std::process::ExitCode;

use orchard_agent::cli::{self, ENV_PREFIX, Invocation, ServeOptions, USAGE, WIPED_VARIABLES};
use orchard_agent::connections::{self, ConnectionLimits};
use orchard_agent::policy_gate::{PolicyGate, ProbeTiming};
use orchard_agent::server;
use orchard_agent::state::{AgentConfig, AppState};
use orchard_agent::{VERSION, hardening, init, install, listen, logging};

fn main() -> ExitCode {
    let mut raw_args = std::env::args_os();
    install::remember_invocation(raw_args.next());
    let args: Vec<String> = raw_args
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect();
    let invocation = match cli::parse(&args, &|name| std::env::var(name).ok()) {
        Ok(invocation) => invocation,
        Err(error) => {
            eprintln!("orchard-agent: {error}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match invocation {
        Invocation::Version => {
            println!("orchard-agent {VERSION}");
            ExitCode::SUCCESS
        }
        Invocation::Help => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Invocation::Install { dir } => match install::install(&dir) {
            Ok(path) => {
                println!("{}", path.display());
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("orchard-agent install: {error}");
                ExitCode::FAILURE
            }
        },
        Invocation::Serve(options) => {
            if let Err(error) = arm_parent_death_signal() {
                eprintln!("orchard-agent: {error}");
                return ExitCode::FAILURE;
            }
            // Before any thread exists (the PID 1 fork and the runtime come later): the token value and
            // the token verifier leave the environment block /proc/<pid>/environ shows, then every
            // ORCHARD_AGENT_* variable leaves the environment children inherit, then /proc/<pid>
            // closes to them.
            for name in WIPED_VARIABLES {
                // SAFETY: single-threaded here; `cli::parse` copied the values out already.
                unsafe { hardening::wipe_environment_value(name) };
            }
            scrub_agent_environment();
            if let Err(error) = hardening::make_non_dumpable() {
                eprintln!("orchard-agent: {error}");
                return ExitCode::FAILURE;
            }
            if std::process::id() == 1 {
                init::run_as_init(|| serve(*options))
            } else {
                serve(*options)
            }
        }
    }
}

/// `ORCHARD_AGENT_DIE_WITH_PARENT=<pid>`: for supervisors that are not a container runtime (the local
/// test node), ask the kernel to SIGKILL the agent when the thread that started it exits. The pid is the
/// expected parent: if it is already gone (the agent was re-parented before arming), exit at once.
fn arm_parent_death_signal() -> Result<(), String> {
    let Ok(value) = std::env::var("ORCHARD_AGENT_DIE_WITH_PARENT") else {
        return Ok(());
    };
    let expected: i32 = value
        .trim()
        .parse()
        .map_err(|_| format!("ORCHARD_AGENT_DIE_WITH_PARENT={value:?} is not a process id"))?;
    // SAFETY: prctl(PR_SET_PDEATHSIG) and getppid have no memory-safety preconditions.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
            return Err(format!(
                "cannot arm the parent-death signal: {}",
                std::io::Error::last_os_error()
            ));
        }
        if libc::getppid() != expected {
            return Err(format!("parent {expected} is already gone"));
        }
    }
    Ok(())
}

/// Removes `ORCHARD_AGENT_*` (the token among them) from this process' environment, so no command the
/// agent starts can inherit them. Runs while the process is still single-threaded.
fn scrub_agent_environment() {
    let keys: Vec<_> = std::env::vars_os()
        .map(|(key, _)| key)
        .filter(|key| key.to_str().is_some_and(|key| key.starts_with(ENV_PREFIX)))
        .collect();
    for key in keys {
        // SAFETY: no other thread exists yet (the runtime starts later), so nothing reads the environment
        // concurrently.
        unsafe { std::env::remove_var(key) };
    }
}

fn serve(options: ServeOptions) -> ExitCode {
    logging::init(options.log_filter.as_deref());
    let config = match AgentConfig::from_options(&options) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("orchard-agent: {error}");
            return ExitCode::from(2);
        }
    };
    // Two workers: the agent mostly waits on children and sockets; the sandbox's CPUs belong to the task.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("orchard-agent: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let listener = match listen::bind(options.listen) {
            Ok(listening) => {
                if let Some(error) = &listening.ipv6_unavailable {
                    tracing::warn!(
                        requested = %options.listen,
                        %error,
                        "no IPv6 here: listening on IPv4 only"
                    );
                }
                listening.listener
            }
            Err(error) => {
                eprintln!(
                    "orchard-agent: cannot listen on {}: {error}",
                    options.listen
                );
                return ExitCode::FAILURE;
            }
        };
        let address = listener
            .local_addr()
            .map(|address| address.to_string())
            .unwrap_or_default();
        if options.insecure_no_auth {
            // Printed whatever the log filter: it must not go unnoticed.
            eprintln!(
                "orchard-agent: WARNING: INSECURE: --insecure-no-auth: serving WITHOUT authentication; anyone who \
                 can reach {address} can run commands and read and write files. For local debugging only, never in a sandbox"
            );
        }
        tracing::info!(
            version = VERSION,
            listen = %address,
            root = %config.root.display(),
            auth = config.token.is_some(),
            "orchard-agent serving"
        );
        let gate = PolicyGate::probing(options.egress_canaries.clone(), ProbeTiming::default());
        let state = AppState::new(config).with_gate(gate);
        if let Some(startup) = &options.startup {
            // Checked now, started once the sandbox's NetworkPolicies are enforced: a command that
            // cannot start still ends the agent (and fails the sandbox), as before the gate.
            let spec = match server::startup_spec(&state.config.root, startup) {
                Ok(spec) => spec,
                Err(error) => {
                    eprintln!("orchard-agent: {error}");
                    return ExitCode::from(2);
                }
            };
            let state = state.clone();
            tokio::spawn(async move {
                state.gate.opened().await;
                if let Err(error) = server::start_startup_command(&state, spec) {
                    eprintln!("orchard-agent: {error}");
                    std::process::exit(2);
                }
            });
        }
        let max_connections = match connections::open_files_limit() {
            Some(open_files) => connections::cap_for_open_files(options.max_connections, open_files),
            None => options.max_connections,
        };
        if max_connections < options.max_connections {
            tracing::info!(
                max_connections,
                configured = options.max_connections,
                "connection cap lowered to half of the open files RLIMIT_NOFILE allows"
            );
        }
        let limits = ConnectionLimits {
            header_read_timeout: options.header_read_timeout,
            max_connections,
        };
        match server::serve(state, listener, limits, server::termination_signal()).await {
            Ok(()) => {
                tracing::info!("orchard-agent stopped");
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("orchard-agent: server failed: {error}");
                ExitCode::FAILURE
            }
        }
    })
}
