//! A `retry` policy as exact amounts (pure): resolved against the resources the first attempt asks
//! for and the operator's defaults ([`resolve`]), and what each next attempt runs with
//! ([`RetryParams::next`], [`RetryParams::after`], [`Escalation::escalate`]).
//!
//! Factors are exact decimals (`orchard_bar::Fraction`, as BAR's fractions: 1.1 is 11/10), so
//! `64Mi x 1.5` is exactly 96Mi. A new memory is rounded up to whole MiB, then capped at
//! `maxMemory`; a new CPU is rounded up to whole millicores, then capped at `maxCpu` when that is set.

use orchard_api::{AttemptRecord, RetryPolicy, SandboxResources};
use orchard_bar::Fraction;

use super::amounts::Amounts;
use super::cause::{AttemptEnd, Cause, MESSAGE_KEPT, cause_of};
use crate::plumbing::quantity::{MIB, bytes, cpu_text, memory_text, millicores};
use crate::plumbing::text::cut;

/// The operator's default sandbox resources (`--default-cpu`, `--default-memory`): what a sandbox
/// (or a group's template) that sets none runs with.
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

/// A `retry` policy, resolved against the first attempt's resources and the operator's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryParams {
    /// Attempts, the first one included.
    pub max_attempts: u32,
    /// Retry out-of-memory attempts with more resources.
    pub on_oom: Option<Escalation>,
    /// Retry evicted attempts as they were.
    pub on_eviction: bool,
    /// What the operator gives a sandbox that sets no amount.
    pub defaults: Amounts,
    /// The resources the first attempt asks for (a group's template's, a Sandbox's spec's); a retry
    /// changes only memory and CPU in them.
    pub base: Option<SandboxResources>,
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

/// `policy` resolved for a first attempt that asks for `resources` (the field `field` says them,
/// e.g. `template.spec.resources`) under the operator's `defaults` (pure), or why it cannot run. An
/// attempt that leaves memory (or CPU) unset runs with the operator's default, which `maxMemory`
/// (`maxCpu`) must not be below.
pub fn resolve(
    policy: &RetryPolicy,
    resources: Option<&SandboxResources>,
    field: &str,
    defaults: &ResourceDefaults,
) -> Result<RetryParams, String> {
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
    let memory = resources.and_then(|r| r.memory.as_ref());
    let cpu = resources.and_then(|r| r.cpu.as_ref());
    let start = Amounts {
        memory: match memory {
            Some(q) => bytes(&q.0).map_err(|e| format!("{field}.memory: {e}"))?,
            None => defaults.memory,
        },
        cpu: match cpu {
            Some(q) => millicores(&q.0).map_err(|e| format!("{field}.cpu: {e}"))?,
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
            let source = |set: bool, amount: &str, flag: &str| {
                if set {
                    format!("{field}.{amount}")
                } else {
                    format!(
                        "the operator's default {amount} ({flag}), since {field}.{amount} is unset"
                    )
                }
            };
            if start.memory > escalation.max_memory {
                return Err(format!(
                    "retry.onOOM.maxMemory {} is below the {} a first attempt runs with ({}): escalation only ever raises memory; raise maxMemory or set a smaller {field}.memory",
                    oom.max_memory.0,
                    memory_text(start.memory),
                    source(memory.is_some(), "memory", "--default-memory"),
                ));
            }
            if let Some(max_cpu) = escalation.max_cpu
                && start.cpu > max_cpu
            {
                return Err(format!(
                    "retry.onOOM.maxCpu {} is below the {} CPU a first attempt runs with ({}): raise maxCpu or set a smaller {field}.cpu",
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
    Ok(RetryParams {
        max_attempts,
        on_oom,
        on_eviction: policy.on_eviction,
        defaults,
        base: resources.cloned(),
        start,
    })
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
    /// What an attempt that asked for `resources` ran with (pure): its amounts, the operator's
    /// defaults where it set none; `None` if one does not parse.
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
    /// when it recorded it; `None` if the record does not say (the first attempt's resources then).
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

    /// The `resources` of an attempt that runs with `amounts` (pure): `None` (the first attempt's,
    /// as they are) when those are what a first attempt gets; otherwise the first attempt's with the
    /// memory and CPU that changed.
    pub fn resources(&self, amounts: Amounts) -> Option<SandboxResources> {
        if amounts == self.start {
            return None;
        }
        let mut resources = self.base.clone().unwrap_or_default();
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

    /// What attempt `attempt` (`1` is the first) runs with when the attempts before it ended as
    /// `previous` records (pure): the first attempt's amounts, else what the last record implies
    /// (the first attempt's too if it does not say).
    pub fn amounts_of(&self, previous: &[AttemptRecord]) -> Amounts {
        previous
            .last()
            .and_then(|last| self.after(last))
            .unwrap_or(self.start)
    }
}

/// How a retry is told (an Event, a log line), pure: `attempt N ended REASON (memory M, cpu C);
/// attempt N+1 gets ...`, with `ended` the record of attempt `attempt` (1-based) and `next` what the
/// attempt after it runs with (`None`: the same resources).
pub fn retry_message(attempt: usize, ended: &AttemptRecord, next: Option<Amounts>) -> String {
    let amounts = |memory: Option<&str>, cpu: Option<&str>| {
        format!(
            "memory {}, cpu {}",
            memory.unwrap_or("?"),
            cpu.unwrap_or("?")
        )
    };
    let next = next.map_or_else(
        || "the same resources".to_string(),
        |a| amounts(Some(&a.memory_quantity().0), Some(&a.cpu_quantity().0)),
    );
    format!(
        "attempt {attempt} ended {} ({}); attempt {} gets {next}",
        ended.reason,
        amounts(
            ended.memory.as_ref().map(|q| q.0.as_str()),
            ended.cpu.as_ref().map(|q| q.0.as_str())
        ),
        attempt + 1,
    )
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
