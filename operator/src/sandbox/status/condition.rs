//! Condition types of a Sandbox.

/// The Pod is bound to a node.
pub const SCHEDULED: &str = "Scheduled";
/// The agent answers its health probe.
pub const AGENT_READY: &str = "AgentReady";
/// The sandbox accepts exec and file calls.
pub const READY: &str = "Ready";
/// A deadline passed.
pub const EXPIRED: &str = "Expired";
