//! The objects the gateway serves, read from the watch caches: finding them ([`lookup`], with the
//! deletions this replica made moments ago in [`recent_deletes`]), waiting for them ([`wait`]),
//! create requests turned into objects ([`spec`], [`names`]), list selectors ([`selector`]) and
//! heartbeats coalesced into few writes ([`heartbeat`]) and lifetimes set from now ([`timeout`]).

pub mod heartbeat;
pub mod lookup;
pub mod names;
pub mod recent_deletes;
pub mod selector;
pub mod spec;
pub mod timeout;
pub mod wait;
