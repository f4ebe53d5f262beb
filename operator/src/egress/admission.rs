//! One request's admission: the sandbox of its source address, that sandbox's decision (reported
//! to the audit), the target's reachable addresses, the registration that lets a policy change cut
//! it, and the upstream TCP connection.

use std::net::IpAddr;
use std::sync::Arc;

use tokio::net::TcpStream;

use super::audit::{Record, Via};
use super::connections::{Open, still_allows};
use super::deps::Shared;
use super::refusal::Refusal;
use super::rules::{Decision, Target};
use super::table::{PolicyTable, SandboxPolicy};
use super::upstream::{self, Unreachable};

/// The policy of the sandbox with address `source`, or why none applies (pure).
fn policy_of(table: &PolicyTable, source: IpAddr) -> Result<&Arc<SandboxPolicy>, String> {
    table.lookup(source).ok_or_else(|| {
        if table.is_conflicted(source) {
            format!(
                "source address {source} is claimed by more than one sandbox; the proxy refuses it until only one holds it"
            )
        } else {
            format!("no sandbox has source address {source}")
        }
    })
}

/// A request the policy allowed, connected to its upstream.
pub(super) struct Admitted {
    /// The registration; dropping it ends the connection's life in the registry.
    pub(super) open: Open,
    /// The upstream connection.
    pub(super) stream: TcpStream,
}

/// Decides a request from `source` to `target:port`, reports the decision, and connects upstream.
pub(super) async fn admit(
    shared: &Shared,
    source: IpAddr,
    target: Target,
    port: u16,
    via: Via,
) -> Result<Admitted, Refusal> {
    let host = target.to_string();
    let label = target.with_port(port);
    let record = |sandbox: Option<&SandboxPolicy>, decision: &Decision| {
        shared.deps.audit.record(&Record {
            source,
            sandbox,
            host: &host,
            port,
            via,
            decision,
        });
    };
    let table = shared.table();
    let policy = match policy_of(&table, source) {
        Ok(policy) => policy.clone(),
        Err(reason) => {
            record(
                None,
                &Decision::Deny {
                    rule: None,
                    reason: reason.clone(),
                },
            );
            tracing::debug!(%source, target = %label, %reason, "egress denied");
            return Err(Refusal::denied(reason));
        }
    };
    let decision = policy.rules.decide(&target, port);
    if let Decision::Deny { reason, .. } = &decision {
        record(Some(&policy), &decision);
        tracing::debug!(sandbox = %policy, target = %label, %reason, "egress denied");
        return Err(Refusal::denied(reason.clone()));
    }
    let deps = &shared.deps;
    let protected = deps.protected.borrow().clone();
    let found = upstream::addresses(
        deps.resolver.as_ref(),
        &protected,
        &target,
        port,
        deps.connect_timeout,
    )
    .await;
    let addresses = match found {
        Ok(addresses) => addresses,
        Err(Unreachable::OnlyProtected(reason)) => {
            let denied = Decision::Deny {
                rule: None,
                reason: reason.clone(),
            };
            record(Some(&policy), &denied);
            tracing::debug!(sandbox = %policy, target = %label, %reason, "egress denied");
            return Err(Refusal::denied(reason));
        }
        Err(Unreachable::NotResolved(reason)) => {
            record(Some(&policy), &decision);
            tracing::debug!(sandbox = %policy, target = %label, %reason, "egress upstream not resolved");
            return Err(Refusal::bad_gateway(reason));
        }
    };
    record(Some(&policy), &decision);
    let open = shared
        .connections
        .open(source, target.clone(), port, policy.clone());
    // A table published after our read was checked by a cut pass that may have run before this
    // connection was registered: check it against the newest table now.
    let newest = shared.table();
    if !Arc::ptr_eq(&newest, &table) {
        let current = newest.lookup(source);
        if !still_allows(current, &policy, &target, port) {
            deps.audit.cut(current.unwrap_or(&policy), &host, port);
            return Err(Refusal::cancelled(shared.shutdown.is_cancelled(), &label));
        }
    }
    let connected = tokio::select! {
        connected = upstream::connect(&addresses, deps.connect_timeout, &label) => connected,
        () = open.token().cancelled() => return Err(Refusal::cancelled(shared.shutdown.is_cancelled(), &label)),
    };
    match connected {
        Ok(stream) => Ok(Admitted { open, stream }),
        Err(reason) => {
            tracing::debug!(sandbox = %policy, target = %label, %reason, "egress upstream unreachable");
            Err(Refusal::bad_gateway(reason))
        }
    }
}
