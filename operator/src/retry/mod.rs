//! Retries of failed attempts (pure), one implementation for both kinds that retry: a RolloutGroup
//! tries a trajectory again (`rollout::retry`), a standalone Sandbox gets a new pod
//! (`sandbox::retry`). [`cause`] says which endings a retry may fix, [`amounts`] holds exact resource
//! amounts, and [`policy`] resolves a `retry` policy and says what each next attempt runs with.

pub mod amounts;
pub mod cause;
pub mod policy;

pub use amounts::Amounts;
pub use cause::{AttemptEnd, Cause, cause_of};
pub use policy::{ResourceDefaults, RetryParams, resolve, retry_message};
