//! Balanced Adaptive Rollout (BAR): the pure engine (no I/O, no clock, no randomness).
//!
//! This crate owns the algorithm (specified in `docs/BAR.md`) and nothing else: classes and ranking
//! ([`rank`]), exact integer bounds on rationals ([`fraction`], [`params`]), `TryAssemble` and the
//! top-ranked fallback ([`assemble`]), the group filter ([`filter`]), the final decision ([`decision`]) and
//! the stride schedule with both early-stop modes ([`schedule`]). The RolloutGroup controller rebuilds a
//! [`Progress`] from status and child Sandboxes and acts on [`next_step`]; `bar-sim` drives the same code.
//!
//! Points the specification leaves open, settled here (also in `docs/BAR.md`):
//! - **Group order.** Every selected group lists its members in rank order (status, length, name).
//! - **TopRanked** is the first N of the whole pool in rank order: usable trajectories ranked by the class
//!   key regardless of sign, then backfill (the status leads the key, so backfill comes last).
//! - **Ranking is total.** After (status, length, name) the reward's total order breaks the ties that only
//!   duplicate names could leave, so shuffled input gives identical output.
//! - **Rewards.** Positive means `reward > 0`. The controller rejects NaN rewards; the engine still never
//!   panics on any `f64` and treats NaN as non-positive (and as equal to NaN for the variance check).
//! - **Zero variance** means the usable members' rewards are all exactly equal (`==`), which includes groups
//!   with fewer than two usable members. Backfill rewards are ignored.
//! - **The group filter** applies to every selection, `Balanced` included, checking zero variance first and
//!   then `max_backfill`; a dropped group has an empty `group`, `positives = 0` and a [`DropReason`].
//! - **Fewer than N trajectories** in a finished pool (only possible with inconsistent controller input) is
//!   dropped as `Empty` or `TooFewTrajectories` even with the filter off: a group is exactly N or nothing.
//! - **Relaxed** uses the same centring on n* as the balanced step, over `1..=N-1`.
//! - **Eager** runs `TryAssemble(n_min, n_max)` on the terminal pool whenever it is asked while trajectories
//!   still run; feasibility only grows with the pool, so Eager reaches `Balanced` exactly when the stride
//!   boundary would, but with the members that finished first.
//! - **Decimals.** [`Fraction::from_f64`] goes through the shortest round-trip decimal, so `0.3` is `3/10`;
//!   `n_min > n_max` is valid and simply makes `Balanced` unreachable.

pub mod assemble;
pub mod decision;
pub mod filter;
pub mod fraction;
pub mod params;
pub mod rank;
pub mod schedule;

#[cfg(feature = "sim")]
pub mod sim;

#[cfg(test)]
mod property_tests;
#[cfg(test)]
mod reference_tests;

pub use assemble::{candidate_order, top_ranked, try_assemble};
pub use decision::{GroupDecision, Selection, decide, decide_balanced};
pub use filter::{DropReason, drop_reason, has_reward_variance};
pub use fraction::{Fraction, FractionError};
pub use params::{Bounds, EarlyStop, GroupFilter, Params, ParamsError, bounds};
pub use rank::{Class, Member, Outcome, RankedPool, Trajectory, classify, rank, rank_order};
pub use schedule::{Progress, Step, next_step};
