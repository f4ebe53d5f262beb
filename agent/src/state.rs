//! What every handler shares: the agent's configuration, resolved at startup ([`AgentConfig`]), and
//! the state built from it ([`AppState`]: process groups, background processes, shell sessions, the output budget,
//! the sandbox's identity, the admission semaphore and the policy gate).

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::auth::Token;
use crate::cli::{ENV_PREFIX, ServeOptions};
use crate::exec::budget::OutputBudget;
use crate::exec::request::CommandSpec;
use crate::files::paths::ProtectedFiles;
use crate::policy_gate::PolicyGate;
use crate::ports::slots::tunnel_slots;
use crate::process_group::ProcessGroups;
use crate::processes::table::{MAX_PROCESSES, ProcessTable};
use crate::sessions::table::{MAX_SESSIONS, SessionTable};

/// Everything the server needs to know, resolved at startup.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Canonical default working directory and base of relative paths.
    pub root: PathBuf,
    pub token: Option<Token>,
    pub max_concurrent: usize,
    pub max_body_bytes: u64,
    pub max_upload_bytes: u64,
    /// Cap on the output buffered by all execs and background processes together.
    pub max_output_bytes_total: u64,
    /// Inherited environment variables removed from every child (`ORCHARD_AGENT_*`).
    pub scrubbed_env: Vec<String>,
    pub protected: ProtectedFiles,
}

impl AgentConfig {
    /// Resolves `options`: loads the token (keeping only its digest), canonicalises the root, finds the
    /// files to protect.
    pub fn from_options(options: &ServeOptions) -> Result<Self, String> {
        let token = options.token.as_ref().map(Token::load).transpose()?;
        let protected = ProtectedFiles::discover(token.as_ref().and_then(Token::file));
        let root = match &options.root {
            Some(root) => root.clone(),
            None => std::env::current_dir()
                .map_err(|error| format!("cannot read the current directory: {error}"))?,
        };
        let root = std::fs::canonicalize(&root)
            .map_err(|error| format!("--root `{}`: {error}", root.display()))?;
        if !root.is_dir() {
            return Err(format!("--root `{}` is not a directory", root.display()));
        }
        let scrubbed_env = std::env::vars_os()
            .filter_map(|(key, _)| key.into_string().ok())
            .filter(|key| key.starts_with(ENV_PREFIX))
            .collect();
        Ok(AgentConfig {
            root,
            token,
            max_concurrent: options.max_concurrent,
            max_body_bytes: options.max_body_bytes,
            max_upload_bytes: options.max_upload_bytes,
            max_output_bytes_total: options.max_output_bytes_total,
            scrubbed_env,
            protected,
        })
    }
}

/// State shared by all handlers.
#[derive(Debug, Clone)]
pub struct AppState {
    pub config: Arc<AgentConfig>,
    pub groups: Arc<ProcessGroups>,
    pub processes: Arc<ProcessTable>,
    /// Shell sessions (`/v1/sessions`).
    pub sessions: Arc<SessionTable>,
    /// A permit per open port-forward tunnel (`/v1/ports/{port}/tunnel`).
    pub tunnels: Arc<Semaphore>,
    /// Output buffered by all execs and background processes together (`--max-output-bytes-total`).
    pub output_budget: Arc<OutputBudget>,
    /// The Sandbox this agent serves, once the operator said so (`PUT /v1/identity`).
    identity: Arc<std::sync::RwLock<Option<String>>>,
    pub(crate) admission: Arc<Semaphore>,
    /// Nothing is served until the sandbox's NetworkPolicies are seen enforced.
    pub gate: PolicyGate,
}

impl AppState {
    pub fn new(config: AgentConfig) -> Self {
        let admission = Arc::new(Semaphore::new(config.max_concurrent));
        let output_budget = OutputBudget::new(config.max_output_bytes_total);
        AppState {
            config: Arc::new(config),
            groups: Arc::default(),
            processes: Arc::new(ProcessTable::new(
                MAX_PROCESSES,
                Some(Arc::clone(&output_budget)),
            )),
            sessions: Arc::new(SessionTable::new(MAX_SESSIONS)),
            tunnels: tunnel_slots(),
            output_budget,
            identity: Arc::default(),
            admission,
            gate: PolicyGate::open(),
        }
    }

    /// The same state, serving only once `gate` opens.
    pub fn with_gate(self, gate: PolicyGate) -> Self {
        AppState { gate, ..self }
    }

    /// Names the Sandbox this agent serves (`PUT /v1/identity`).
    pub fn set_identity(&self, name: &str) {
        *self.identity.write().unwrap_or_else(|p| p.into_inner()) = Some(name.to_string());
    }

    /// Gives `spec` the `ORCHARD_SANDBOX` of the identity set by `PUT /v1/identity`, unless the
    /// request's own `env` sets it (which wins, as it wins over the Pod's environment).
    pub fn apply_identity(&self, spec: &mut CommandSpec) {
        self.apply_identity_env(&mut spec.env);
    }

    /// The same for an environment of its own (sessions).
    pub fn apply_identity_env(&self, env: &mut Vec<(String, String)>) {
        let identity = self.identity.read().unwrap_or_else(|p| p.into_inner());
        if let Some(name) = identity.as_ref()
            && !env.iter().any(|(key, _)| key == IDENTITY_ENV)
        {
            env.insert(0, (IDENTITY_ENV.to_string(), name.clone()));
        }
    }
}

/// The variable that names the Sandbox to commands.
pub const IDENTITY_ENV: &str = "ORCHARD_SANDBOX";
