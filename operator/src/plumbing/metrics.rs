//! Prometheus metrics of the operator: one registry owned by the process, served on `/metrics`.
//! Every metric is listed (name, labels, meaning) in `docs/METRICS.md`; keep the two in sync.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// Buckets for reconcile durations, in seconds.
const RECONCILE_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Buckets for create->Ready latency, in seconds.
const READY_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
];
/// Buckets for HTTP request durations (gateway), in seconds.
pub const HTTP_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0,
];

/// The `kind` of `orchard_retries_total` for a RolloutGroup's trajectory tried again.
pub const RETRY_KIND_TRAJECTORY: &str = "trajectory";
/// The `kind` of `orchard_retries_total` for a standalone Sandbox given a new pod.
pub const RETRY_KIND_SANDBOX: &str = "sandbox";

/// All metrics of the operator.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// `orchard_reconciles_total{controller, outcome}`: reconciles by outcome (`ok` or `error`).
    pub reconciles: IntCounterVec,
    /// `orchard_reconcile_errors_total{controller, error}`: failed reconciles by error kind.
    pub reconcile_errors: IntCounterVec,
    /// `orchard_reconcile_duration_seconds{controller}`: reconcile latency.
    pub reconcile_duration: HistogramVec,
    /// `orchard_sandboxes{phase}`: sandboxes by phase (computed from the watch cache at scrape time).
    pub sandboxes: IntGaugeVec,
    /// `orchard_sandbox_ready_seconds`: sandbox creation to Ready.
    pub sandbox_ready_seconds: Histogram,
    /// `orchard_sandbox_failures_total{reason}`: sandboxes that became Failed, by reason.
    pub sandbox_failures: IntCounterVec,
    /// `orchard_sandbox_expirations_total{cause}`: sandboxes deleted at a deadline (`ttl` or `heartbeat`).
    pub expirations: IntCounterVec,
    /// `orchard_api_writes_total{resource, verb}`: writes the operator sent to the API server.
    pub api_writes: IntCounterVec,
    /// `orchard_trajectory_runs_total{outcome}`: `spec.run` results recorded by the operator, by
    /// status (`completed`, `truncated`) or abort reason (`TimeExceeded`, `NoResult`, ...).
    pub trajectory_runs: IntCounterVec,
    /// `orchard_bar_trajectories_total{outcome}`: trajectories a RolloutGroup recorded as finished
    /// (`completed`, `truncated`, `aborted`).
    pub bar_trajectories: IntCounterVec,
    /// `orchard_bar_groups_total{selection}`: RolloutGroups completed, by selection.
    pub bar_groups: IntCounterVec,
    /// `orchard_retries_total{kind, reason}`: attempts that were retried (`spec.retry`): of a
    /// RolloutGroup's trajectories ([`RETRY_KIND_TRAJECTORY`]) or of standalone Sandboxes' pods
    /// ([`RETRY_KIND_SANDBOX`]), by how they ended (`OOMKilled`, `Evicted`, `PodDeleted`, `NodeLost`).
    pub retries: IntCounterVec,
    /// `orchard_bar_trajectories_launched_per_group`: trajectories a completed group launched.
    pub bar_launched_per_group: Histogram,
    /// `orchard_leader`: 1 while this replica holds the leader Lease (always 1 without election).
    pub leader: prometheus::IntGauge,
    /// `orchard_bar_group_duration_seconds{selection}`: group creation to its recorded group.
    pub bar_group_duration: HistogramVec,
    /// `orchard_rolloutgroups{phase}`: RolloutGroups by phase (from the watch cache at scrape time).
    pub rollout_groups: IntGaugeVec,
    /// `orchard_sandbox_expiry_lateness_seconds{cause}`: how late after `expiresAt` the operator acted.
    pub expiry_lateness: HistogramVec,
    /// `orchard_queue_running_trajectories{queue_namespace, queue}`: trajectories holding a queue's slots.
    pub queue_running: IntGaugeVec,
    /// `orchard_queue_waiting_groups{queue_namespace, queue}`: groups whose next stride waits.
    pub queue_waiting_groups: IntGaugeVec,
    /// `orchard_queue_waiting_trajectories{queue_namespace, queue}`: trajectories the waiting strides ask for.
    pub queue_waiting_trajectories: IntGaugeVec,
    /// `orchard_queue_admitted_trajectories_total{queue_namespace, queue}`: trajectories admitted.
    pub queue_admitted: IntCounterVec,
    /// `orchard_queue_wait_seconds{queue_namespace, queue}`: how long each admitted stride waited.
    pub queue_wait_seconds: HistogramVec,
    /// `orchard_pool_claims_total{start}`: Sandboxes of pools that claimed a warm member (`warm`) or started their own Pod (`cold`).
    pub pool_claims: IntCounterVec,
    /// `orchard_pool_members{pool_namespace, pool, state}`: unclaimed members of each pool, `ready` or `starting`.
    pub pool_members: IntGaugeVec,
    /// `orchard_network_policy_enforcement{state}`: 1 for the cluster-wide verdict (`unknown`,
    /// `missing`, `enforced`), 0 for the others.
    pub network_policy_enforcement: IntGaugeVec,
}

fn gauge(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntGaugeVec> {
    let metric = IntGaugeVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

fn counter(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntCounterVec> {
    let metric = IntCounterVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        let reconcile_duration = HistogramVec::new(
            HistogramOpts::new(
                "orchard_reconcile_duration_seconds",
                "Duration of reconciles.",
            )
            .buckets(RECONCILE_BUCKETS.to_vec()),
            &["controller"],
        )?;
        registry.register(Box::new(reconcile_duration.clone()))?;
        let sandboxes = IntGaugeVec::new(
            Opts::new(
                "orchard_sandboxes",
                "Sandboxes by phase, from the operator's watch cache.",
            ),
            &["phase"],
        )?;
        registry.register(Box::new(sandboxes.clone()))?;
        let sandbox_ready_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "orchard_sandbox_ready_seconds",
                "Time from Sandbox creation to Ready (agent answering), as observed by the operator.",
            )
            .buckets(READY_BUCKETS.to_vec()),
        )?;
        registry.register(Box::new(sandbox_ready_seconds.clone()))?;
        let bar_launched_per_group = Histogram::with_opts(
            HistogramOpts::new(
                "orchard_bar_trajectories_launched_per_group",
                "Trajectories launched by each completed RolloutGroup.",
            )
            .buckets(vec![
                1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 128.0, 256.0,
            ]),
        )?;
        registry.register(Box::new(bar_launched_per_group.clone()))?;
        let leader = prometheus::IntGauge::new(
            "orchard_leader",
            "1 while this replica holds the leader Lease and runs the controllers' writes.",
        )?;
        registry.register(Box::new(leader.clone()))?;
        let queue_wait_seconds = HistogramVec::new(
            HistogramOpts::new(
                "orchard_queue_wait_seconds",
                "Time each admitted stride waited for its RolloutQueue.",
            )
            .buckets(READY_BUCKETS.to_vec()),
            &["queue_namespace", "queue"],
        )?;
        registry.register(Box::new(queue_wait_seconds.clone()))?;
        let bar_group_duration = HistogramVec::new(
            HistogramOpts::new(
                "orchard_bar_group_duration_seconds",
                "Time from a RolloutGroup's creation to its recorded group, by selection.",
            )
            .buckets(vec![
                1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0,
            ]),
            &["selection"],
        )?;
        registry.register(Box::new(bar_group_duration.clone()))?;
        let expiry_lateness = HistogramVec::new(
            HistogramOpts::new(
                "orchard_sandbox_expiry_lateness_seconds",
                "How late after a sandbox's expiresAt the operator ended it, by cause.",
            )
            .buckets(vec![
                0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
            ]),
            &["cause"],
        )?;
        registry.register(Box::new(expiry_lateness.clone()))?;
        Ok(Self {
            bar_group_duration,
            expiry_lateness,
            rollout_groups: gauge(
                &registry,
                "orchard_rolloutgroups",
                "RolloutGroups by phase, from the operator's watch cache.",
                &["phase"],
            )?,
            pool_claims: counter(
                &registry,
                "orchard_pool_claims_total",
                "Sandboxes naming a SandboxPool that claimed a warm member (start=warm) or started their own Pod (start=cold).",
                &["start"],
            )?,
            network_policy_enforcement: gauge(
                &registry,
                "orchard_network_policy_enforcement",
                "Whether NetworkPolicies are enforced in the cluster, as the sandboxes' agents tell: 1 for the current state (unknown, missing, enforced).",
                &["state"],
            )?,
            pool_members: gauge(
                &registry,
                "orchard_pool_members",
                "Unclaimed members of each SandboxPool, by state (ready, starting).",
                &["pool_namespace", "pool", "state"],
            )?,
            queue_running: gauge(
                &registry,
                "orchard_queue_running_trajectories",
                "Trajectories holding a RolloutQueue's slots (admitted, Sandbox or Pod not gone).",
                &["queue_namespace", "queue"],
            )?,
            queue_waiting_groups: gauge(
                &registry,
                "orchard_queue_waiting_groups",
                "RolloutGroups whose next stride waits for admission by the queue.",
                &["queue_namespace", "queue"],
            )?,
            queue_waiting_trajectories: gauge(
                &registry,
                "orchard_queue_waiting_trajectories",
                "Trajectories the strides waiting on the queue ask for.",
                &["queue_namespace", "queue"],
            )?,
            queue_admitted: counter(
                &registry,
                "orchard_queue_admitted_trajectories_total",
                "Trajectories admitted by RolloutQueues.",
                &["queue_namespace", "queue"],
            )?,
            queue_wait_seconds,
            trajectory_runs: counter(
                &registry,
                "orchard_trajectory_runs_total",
                "Trajectory runs (spec.run) whose result the operator recorded, by status or abort reason.",
                &["outcome"],
            )?,
            bar_trajectories: counter(
                &registry,
                "orchard_bar_trajectories_total",
                "Finished trajectories recorded by RolloutGroups, by outcome.",
                &["outcome"],
            )?,
            retries: counter(
                &registry,
                "orchard_retries_total",
                "Attempts that were retried under spec.retry: RolloutGroup trajectories (kind=trajectory) and standalone Sandboxes' pods (kind=sandbox), by how they ended.",
                &["kind", "reason"],
            )?,
            bar_groups: counter(
                &registry,
                "orchard_bar_groups_total",
                "Completed RolloutGroups by selection.",
                &["selection"],
            )?,
            bar_launched_per_group,
            leader,
            reconciles: counter(
                &registry,
                "orchard_reconciles_total",
                "Reconciles by controller and outcome.",
                &["controller", "outcome"],
            )?,
            reconcile_errors: counter(
                &registry,
                "orchard_reconcile_errors_total",
                "Failed reconciles by controller and error kind.",
                &["controller", "error"],
            )?,
            reconcile_duration,
            sandboxes,
            sandbox_ready_seconds,
            sandbox_failures: counter(
                &registry,
                "orchard_sandbox_failures_total",
                "Sandboxes that became Failed, by reason.",
                &["reason"],
            )?,
            expirations: counter(
                &registry,
                "orchard_sandbox_expirations_total",
                "Sandboxes deleted at their TTL or heartbeat deadline.",
                &["cause"],
            )?,
            api_writes: counter(
                &registry,
                "orchard_api_writes_total",
                "Write requests the operator sent to the Kubernetes API, by resource and verb.",
                &["resource", "verb"],
            )?,
            registry,
        })
    }

    /// The registry, for subsystems that register their own metrics (gateway, rollouts).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Records one API write.
    pub fn api_write(&self, resource: &str, verb: &str) {
        self.api_writes.with_label_values(&[resource, verb]).inc();
    }

    /// Renders every metric in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        let encoder = TextEncoder::new();
        if let Err(err) = encoder.encode(&self.registry.gather(), &mut buffer) {
            return format!("# error encoding metrics: {err}\n");
        }
        String::from_utf8(buffer).unwrap_or_default()
    }
}

/// A guard that observes a reconcile's duration when dropped.
pub struct ReconcileTimer {
    timer: Option<prometheus::HistogramTimer>,
}

impl ReconcileTimer {
    /// Starts timing a reconcile of `controller`.
    pub fn start(metrics: &Metrics, controller: &str) -> Self {
        Self {
            timer: Some(
                metrics
                    .reconcile_duration
                    .with_label_values(&[controller])
                    .start_timer(),
            ),
        }
    }
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        if let Some(timer) = self.timer.take() {
            timer.observe_duration();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_render_in_text_format() {
        let metrics = Metrics::new().unwrap();
        metrics.api_write("pods", "create");
        metrics.sandboxes.with_label_values(&["Ready"]).set(3);
        let text = metrics.render();
        assert!(
            text.contains(r#"orchard_api_writes_total{resource="pods",verb="create"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"orchard_sandboxes{phase="Ready"} 3"#),
            "{text}"
        );
    }
}
