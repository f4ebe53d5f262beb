//! Retries of a RolloutGroup's trajectories (pure): which endings of an attempt a retry may fix
//! ([`attempt_end`], [`cause_of`]), the group's `retry` policy as exact amounts ([`retry_params`]),
//! and the resources of the next attempt ([`RetryParams::next`], [`RetryParams::after`]).
//!
//! Amounts are exact integers: memory in bytes, CPU in millicores, parsed from Kubernetes quantities
//! (rounded up: a quantity below a byte or a millicore still asks for one). Factors are exact
//! decimals (`orchard_bar::Fraction`, as BAR's fractions: 1.1 is 11/10), so `64Mi x 1.5` is exactly
//! 96Mi. A new memory is rounded up to whole MiB, then capped at `maxMemory`; a new CPU is rounded up
//! to whole millicores, then capped at `maxCpu` when that is set.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use orchard_api::{
    AttemptRecord, RolloutGroupSpec, SandboxResources, TrajectoryResult, TrajectoryStatus,
};
use orchard_bar::Fraction;

/// An attempt whose task (the run's command, or the whole task container) the kernel's
/// out-of-memory killer ended: the run's result reason, and the Sandbox failure reason
/// (`pod/oom.rs`, which this layer does not import).
pub const OOM_KILLED: &str = "OOMKilled";
/// A pod the kubelet evicted (node pressure, or its ephemeral storage over the limit).
pub const EVICTED: &str = "Evicted";
/// A pod deleted under its sandbox (a drained or deleted node, a user).
pub const POD_DELETED: &str = "PodDeleted";
/// A pod the node controller marked lost with its node.
pub const NODE_LOST: &str = "NodeLost";
/// The result reason of a trajectory whose Sandbox failed (`sandbox/status`): the failure's own
/// reason is in the Sandbox's `status.reason`.
pub const SANDBOX_FAILED: &str = "SandboxFailed";
/// What the kubelet's eviction message says when the node ran short of memory.
pub const LOW_ON_MEMORY: &str = "low on resource: memory";
/// How much of an attempt's message `previousAttempts` keeps (the start of it: the status of a group
/// of many trajectories must stay far below the API server's object size limit).
pub const MESSAGE_KEPT: usize = 512;

const MIB: u64 = 1 << 20;

/// Why an attempt may be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// It was OOM-killed: retried with more memory (`onOOM`).
    OutOfMemory,
    /// Its pod was evicted because the node was low on memory: retried with more memory (`onOOM`),
    /// or, without `onOOM` or at `maxMemory`, as it was (`onEviction`).
    MemoryEviction,
    /// Its pod was evicted or deleted under it: retried as it was (`onEviction`).
    Eviction,
}

/// The cause an attempt that ended with `reason` and `message` has, if a retry may fix it (pure).
pub fn cause_of(reason: &str, message: &str) -> Option<Cause> {
    match reason {
        OOM_KILLED => Some(Cause::OutOfMemory),
        EVICTED if message.contains(LOW_ON_MEMORY) => Some(Cause::MemoryEviction),
        EVICTED | POD_DELETED | NODE_LOST => Some(Cause::Eviction),
        _ => None,
    }
}

/// How an attempt ended, when a retry may fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptEnd {
    /// Out of memory or evicted.
    pub cause: Cause,
    /// `OOMKilled`, `Evicted`, `PodDeleted` or `NodeLost`.
    pub reason: String,
    /// What the run or the sandbox said.
    pub message: String,
}

/// The ending of an attempt whose Sandbox recorded `result` and, if it failed, `failure` (its
/// `status.reason` and `status.message`), when a retry may fix it (pure). Only an aborted result
/// counts: a run's command killed by the OOM killer (`OOMKilled`), or a Sandbox whose failure
/// (`SandboxFailed`) was an OOM kill, an eviction or a lost pod. A result the run recorded before
/// its Sandbox failed stands.
pub fn attempt_end(result: &TrajectoryResult, failure: Option<(&str, &str)>) -> Option<AttemptEnd> {
    if result.status != TrajectoryStatus::Aborted {
        return None;
    }
    let (reason, message) = match result.reason.as_deref() {
        Some(OOM_KILLED) => (OOM_KILLED, result.message.as_deref().unwrap_or_default()),
        Some(SANDBOX_FAILED) => failure?,
        _ => return None,
    };
    Some(AttemptEnd {
        cause: cause_of(reason, message)?,
        reason: reason.to_string(),
        message: message.to_string(),
    })
}

/// Resource amounts of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Amounts {
    /// Memory in bytes.
    pub memory: u64,
    /// CPU in millicores.
    pub cpu: u64,
}

impl Amounts {
    /// The memory as a quantity: whole GiB or MiB when it is, else bytes.
    pub fn memory_quantity(&self) -> Quantity {
        Quantity(memory_text(self.memory))
    }

    /// The CPU as a quantity: whole cores when it is, else millicores.
    pub fn cpu_quantity(&self) -> Quantity {
        Quantity(cpu_text(self.cpu))
    }
}

/// `bytes` as a quantity text (pure): `2Gi`, `96Mi`, or the bytes.
pub fn memory_text(bytes: u64) -> String {
    for (suffix, unit) in [("Ti", 1u64 << 40), ("Gi", 1 << 30), ("Mi", MIB)] {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

/// `millicores` as a quantity text (pure): `2` or `1500m`.
pub fn cpu_text(millicores: u64) -> String {
    if millicores >= 1000 && millicores.is_multiple_of(1000) {
        format!("{}", millicores / 1000)
    } else {
        format!("{millicores}m")
    }
}

/// A Kubernetes quantity in thousandths of its unit, rounded up (pure): `1500m` is 1,500, `2` is
/// 2,000, `64Mi` is 67,108,864,000. Refuses a sign other than `+`, an unknown suffix and amounts
/// beyond `u64` units.
pub fn thousandths(text: &str) -> Result<u128, String> {
    let invalid = || format!("`{text}` is not a quantity");
    let unsigned = text.trim().strip_prefix('+').unwrap_or(text.trim());
    let number_end = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err(invalid());
    }
    let digits = format!("{whole}{fraction}");
    let mantissa: u128 = digits.parse().map_err(|_| invalid())?;
    let fraction_digits = u32::try_from(fraction.len()).map_err(|_| invalid())?;
    // value = mantissa / 10^fraction_digits x 2^binary x 10^decimal; thousandths = value x 10^3.
    let (binary, decimal): (u32, i32) = match suffix {
        "" => (0, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        exponent => {
            let power = exponent
                .strip_prefix(['e', 'E'])
                .filter(|p| !p.is_empty())
                .ok_or_else(invalid)?;
            let power: i32 = power.parse().map_err(|_| invalid())?;
            if !(-40..=40).contains(&power) {
                return Err(invalid());
            }
            (0, power)
        }
    };
    let too_large = || format!("`{text}` is too large");
    let ten = |power: u32| 10u128.checked_pow(power).ok_or_else(too_large);
    let scale = decimal + 3 - i32::try_from(fraction_digits).map_err(|_| invalid())?;
    let mut numerator = mantissa
        .checked_mul(1u128 << binary)
        .ok_or_else(too_large)?;
    let mut denominator = 1u128;
    if scale >= 0 {
        numerator = numerator
            .checked_mul(ten(scale.unsigned_abs())?)
            .ok_or_else(too_large)?;
    } else {
        denominator = ten(scale.unsigned_abs())?;
    }
    let value = numerator.div_ceil(denominator);
    if value > u128::from(u64::MAX) * 1000 {
        return Err(too_large());
    }
    Ok(value)
}

/// A memory quantity in bytes, rounded up (pure).
pub fn bytes(text: &str) -> Result<u64, String> {
    u64::try_from(thousandths(text)?.div_ceil(1000)).map_err(|_| format!("`{text}` is too large"))
}

/// A CPU quantity in millicores, rounded up (pure).
pub fn millicores(text: &str) -> Result<u64, String> {
    u64::try_from(thousandths(text)?).map_err(|_| format!("`{text}` is too large"))
}

/// The operator's default sandbox resources (`--default-cpu`, `--default-memory`): what a template
/// that sets none runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceDefaults {
    /// CPU, e.g. `1`.
    pub cpu: String,
    /// Memory, e.g. `2Gi`.
    pub memory: String,
}

/// How an out-of-memory attempt's resources grow.
#[derive(Debug, Clone, PartialEq)]
pub struct Escalation {
    /// Memory factor, exact.
    pub memory_factor: Fraction,
    /// CPU factor, exact; `None`: the CPU stays.
    pub cpu_factor: Option<Fraction>,
    /// Most memory, bytes.
    pub max_memory: u64,
    /// Most CPU, millicores; `None`: no cap.
    pub max_cpu: Option<u64>,
}

/// A group's `retry` policy, resolved against the template and the operator's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryParams {
    /// Attempts per trajectory, the first one included.
    pub max_attempts: u32,
    /// Retry out-of-memory attempts with more resources.
    pub on_oom: Option<Escalation>,
    /// Retry evicted attempts as they were.
    pub on_eviction: bool,
    /// What the operator gives a sandbox that sets no amount.
    pub defaults: Amounts,
    /// The template's own resources (a retry changes only memory and CPU in them).
    pub template: Option<SandboxResources>,
    /// What a first attempt runs with.
    pub start: Amounts,
}

fn factor(value: f64, field: &str) -> Result<Fraction, String> {
    if !(value.is_finite() && value > 1.0) {
        return Err(format!(
            "retry.onOOM.{field} must be greater than 1, got {value}"
        ));
    }
    Fraction::from_f64(value).map_err(|e| format!("retry.onOOM.{field} = {value}: {e}"))
}

fn positive(amount: u64, text: &str, field: &str) -> Result<u64, String> {
    if amount == 0 {
        return Err(format!(
            "retry.onOOM.{field} must be greater than 0, got {text}"
        ));
    }
    Ok(amount)
}

/// The retry policy of `spec` under the operator's `defaults` (pure): `None` without `retry`, or
/// why it cannot run. A template that leaves memory (or CPU, with a `cpuFactor`) unset starts with
/// the operator's default, which `maxMemory` (`maxCpu`) must not be below; one that names a
/// SandboxPool must set them itself (its members have the pool template's).
pub fn retry_params(
    spec: &RolloutGroupSpec,
    defaults: &ResourceDefaults,
) -> Result<Option<RetryParams>, String> {
    let Some(policy) = &spec.retry else {
        return Ok(None);
    };
    let max_attempts = u32::try_from(policy.max_attempts)
        .ok()
        .filter(|n| (1..=10).contains(n))
        .ok_or_else(|| {
            format!(
                "retry.maxAttempts must be 1 to 10, got {}",
                policy.max_attempts
            )
        })?;
    let defaults = Amounts {
        memory: bytes(&defaults.memory)
            .map_err(|e| format!("the operator's --default-memory: {e}"))?,
        cpu: millicores(&defaults.cpu).map_err(|e| format!("the operator's --default-cpu: {e}"))?,
    };
    let template = spec.template.spec.resources.clone();
    let pool = spec.template.spec.pool.as_deref().filter(|p| !p.is_empty());
    let memory = template.as_ref().and_then(|r| r.memory.as_ref());
    let cpu = template.as_ref().and_then(|r| r.cpu.as_ref());
    let start = Amounts {
        memory: match memory {
            Some(q) => bytes(&q.0).map_err(|e| format!("template.spec.resources.memory: {e}"))?,
            None => defaults.memory,
        },
        cpu: match cpu {
            Some(q) => millicores(&q.0).map_err(|e| format!("template.spec.resources.cpu: {e}"))?,
            None => defaults.cpu,
        },
    };
    let on_oom = match &policy.on_oom {
        None => None,
        Some(oom) => {
            let escalation = Escalation {
                memory_factor: factor(oom.memory_factor, "memoryFactor")?,
                cpu_factor: oom.cpu_factor.map(|f| factor(f, "cpuFactor")).transpose()?,
                max_memory: positive(
                    bytes(&oom.max_memory.0).map_err(|e| format!("retry.onOOM.maxMemory: {e}"))?,
                    &oom.max_memory.0,
                    "maxMemory",
                )?,
                max_cpu: oom
                    .max_cpu
                    .as_ref()
                    .map(|q| {
                        positive(
                            millicores(&q.0).map_err(|e| format!("retry.onOOM.maxCpu: {e}"))?,
                            &q.0,
                            "maxCpu",
                        )
                    })
                    .transpose()?,
            };
            if let Some(pool) = pool {
                if memory.is_none() {
                    return Err(format!(
                        "retry.onOOM needs template.spec.resources.memory when the template names SandboxPool {pool}: its members run with the pool template's memory, which the group does not know; set the memory the first attempt runs with"
                    ));
                }
                if escalation.cpu_factor.is_some() && cpu.is_none() {
                    return Err(format!(
                        "retry.onOOM.cpuFactor needs template.spec.resources.cpu when the template names SandboxPool {pool}: its members run with the pool template's CPU, which the group does not know"
                    ));
                }
            }
            let source = |set: bool, field: &str, flag: &str| {
                if set {
                    format!("template.spec.resources.{field}")
                } else {
                    format!("the operator's default {field} ({flag}), since the template sets none")
                }
            };
            if start.memory > escalation.max_memory {
                return Err(format!(
                    "retry.onOOM.maxMemory {} is below the {} a first attempt runs with ({}): escalation only ever raises memory; raise maxMemory or set a smaller template.spec.resources.memory",
                    oom.max_memory.0,
                    memory_text(start.memory),
                    source(memory.is_some(), "memory", "--default-memory"),
                ));
            }
            if let Some(max_cpu) = escalation.max_cpu
                && start.cpu > max_cpu
            {
                return Err(format!(
                    "retry.onOOM.maxCpu {} is below the {} CPU a first attempt runs with ({}): raise maxCpu or set a smaller template.spec.resources.cpu",
                    oom.max_cpu
                        .as_ref()
                        .map(|q| q.0.as_str())
                        .unwrap_or_default(),
                    cpu_text(start.cpu),
                    source(cpu.is_some(), "cpu", "--default-cpu"),
                ));
            }
            Some(escalation)
        }
    };
    Ok(Some(RetryParams {
        max_attempts,
        on_oom,
        on_eviction: policy.on_eviction,
        defaults,
        template,
        start,
    }))
}

impl Escalation {
    /// The amounts after an out-of-memory attempt that ran with `ran` (pure); `None` when its memory
    /// was at `maxMemory` already. Memory: `ran x memoryFactor` rounded up to whole MiB, capped at
    /// `maxMemory`; CPU: `ran x cpuFactor` rounded up to whole millicores, capped at `maxCpu`, or
    /// unchanged without a `cpuFactor`.
    pub fn escalate(&self, ran: Amounts) -> Option<Amounts> {
        if ran.memory >= self.max_memory {
            return None;
        }
        let grown = self
            .memory_factor
            .ceil_times(ran.memory)
            .div_ceil(u128::from(MIB))
            .saturating_mul(u128::from(MIB));
        let memory = u64::try_from(grown.min(u128::from(self.max_memory))).unwrap_or(u64::MAX);
        let cpu = match self.cpu_factor {
            None => ran.cpu,
            Some(factor) => {
                let grown = u64::try_from(factor.ceil_times(ran.cpu)).unwrap_or(u64::MAX);
                self.max_cpu
                    .map_or(grown, |max| grown.min(max.max(ran.cpu)))
            }
        };
        Some(Amounts { memory, cpu })
    }
}

impl RetryParams {
    /// What an attempt whose Sandbox asked for `resources` ran with (pure): its amounts, the
    /// operator's defaults where it set none; `None` if one does not parse.
    pub fn ran(&self, resources: Option<&SandboxResources>) -> Option<Amounts> {
        let memory = resources.and_then(|r| r.memory.as_ref());
        let cpu = resources.and_then(|r| r.cpu.as_ref());
        Some(Amounts {
            memory: memory
                .map_or(Ok(self.defaults.memory), |q| bytes(&q.0))
                .ok()?,
            cpu: cpu
                .map_or(Ok(self.defaults.cpu), |q| millicores(&q.0))
                .ok()?,
        })
    }

    /// What a retry of an attempt that ended with `cause` having run with `ran` gets (pure), if
    /// the policy retries it: more memory for an OOM kill (none at `maxMemory`), more memory for an
    /// eviction for memory where possible and the same otherwise (with `onEviction`), the same for
    /// an eviction.
    fn grant(&self, cause: Cause, ran: Amounts) -> Option<Amounts> {
        let escalated = || self.on_oom.as_ref()?.escalate(ran);
        let same = || self.on_eviction.then_some(ran);
        match cause {
            Cause::OutOfMemory => escalated(),
            Cause::MemoryEviction => escalated().or_else(same),
            Cause::Eviction => same(),
        }
    }

    /// What attempt `attempt + 1` runs with after attempt `attempt` ended with `cause` having run
    /// with `ran` (pure); `None`: no retry (no attempts left, the cause is not retried, or an OOM
    /// kill at `maxMemory` already).
    pub fn next(&self, cause: Cause, attempt: u32, ran: Amounts) -> Option<Amounts> {
        if attempt >= self.max_attempts {
            return None;
        }
        self.grant(cause, ran)
    }

    /// What the attempt after the recorded `last` one runs with (pure), as [`Self::next`] decided
    /// when it recorded it; `None` if the record does not say (the template's resources then).
    pub fn after(&self, last: &AttemptRecord) -> Option<Amounts> {
        let ran = Amounts {
            memory: bytes(&last.memory.as_ref()?.0).ok()?,
            cpu: millicores(&last.cpu.as_ref()?.0).ok()?,
        };
        self.grant(
            cause_of(&last.reason, last.message.as_deref().unwrap_or_default())?,
            ran,
        )
    }

    /// The `resources` of an attempt that runs with `amounts` (pure): `None` (the template's, as
    /// they are) when those are what a first attempt gets; otherwise the template's with the memory
    /// and CPU that changed.
    pub fn resources(&self, amounts: Amounts) -> Option<SandboxResources> {
        if amounts == self.start {
            return None;
        }
        let mut resources = self.template.clone().unwrap_or_default();
        if amounts.memory != self.start.memory {
            resources.memory = Some(amounts.memory_quantity());
        }
        if amounts.cpu != self.start.cpu {
            resources.cpu = Some(amounts.cpu_quantity());
        }
        Some(resources)
    }

    /// The record of an attempt that ended as `end` having run with `ran` (pure); its message is
    /// cut to [`MESSAGE_KEPT`] bytes.
    pub fn record(end: &AttemptEnd, ran: Amounts) -> AttemptRecord {
        AttemptRecord {
            reason: end.reason.clone(),
            message: Some(cut(&end.message, MESSAGE_KEPT)).filter(|m| !m.is_empty()),
            memory: Some(ran.memory_quantity()),
            cpu: Some(ran.cpu_quantity()),
        }
    }
}

fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

#[cfg(test)]
#[path = "retry_tests.rs"]
mod tests;
