//! RolloutQueues: admission of RolloutGroup strides against a bounded number of trajectory slots.
//!
//! [`order`] (which waiting strides go first) and [`accounting`] (who holds a slot, from the caches)
//! are pure; [`book`] is the in-memory admission state under one lock; [`admission`] is what the
//! RolloutGroup controller asks before launching a stride; [`controller`] is the queue loop that wakes
//! admissible groups, writes each RolloutQueue's status and exports the queue metrics, each pass
//! decided by [`decide`] (pure) and carried out by [`execute`].
//! docs/QUEUES.md explains the behaviour.

pub mod accounting;
pub mod admission;
pub mod book;
pub mod context;
pub mod controller;
pub mod decide;
pub mod execute;
pub mod order;
pub mod watching;
