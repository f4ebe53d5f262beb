//! Launch jitter (pure): when each trajectory of a stride starts, spread over the group's
//! `launchJitterSeconds` so that many groups launching at once do not create every Pod in the same
//! instant (the Orchard paper's jitter against thundering herds).
//!
//! The trajectories of a stride are put in an order that is a fixed function of the group's UID and
//! their indices (FNV-1a of both: the same after an operator restart or upgrade, different between
//! groups), and the k-th of n starts `k/n` of the jitter after the stride's launch: evenly spread,
//! the first at once. The group records the start time on each trajectory Sandbox
//! (`orchard.dev/launch-after`); the Sandbox controller creates no Pod before it
//! (`plumbing::launch_after`).

use std::time::Duration;

use orchard_api::RolloutGroupSpec;

/// The jitter of a group whose spec leaves `launchJitterSeconds` unset.
pub const DEFAULT_JITTER: Duration = Duration::from_secs(1);

/// The group's jitter (pure): its `launchJitterSeconds`, or [`DEFAULT_JITTER`]; a value the schema
/// would refuse (negative, not finite, over 60) counts as 0 or 60.
pub fn jitter_of(spec: &RolloutGroupSpec) -> Duration {
    match spec.launch_jitter_seconds {
        None => DEFAULT_JITTER,
        Some(seconds) if seconds.is_finite() => Duration::from_secs_f64(seconds.clamp(0.0, 60.0)),
        Some(_) => Duration::ZERO,
    }
}

/// FNV-1a over `uid` and `index` (stable across processes and versions, unlike `DefaultHasher`).
fn order_key(uid: &str, index: u32) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in uid.bytes().chain(index.to_le_bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// How long after the stride's launch each trajectory of `indices` starts (pure), in the order of
/// `indices`: `k/n` of `jitter` for the k-th of n in the group's order.
pub fn offsets(uid: &str, indices: &[u32], jitter: Duration) -> Vec<Duration> {
    let mut order: Vec<u32> = indices.to_vec();
    order.sort_by_key(|&index| (order_key(uid, index), index));
    let n = u32::try_from(indices.len()).unwrap_or(u32::MAX).max(1);
    indices
        .iter()
        .map(|index| {
            let rank = order.iter().position(|i| i == index).unwrap_or(0);
            jitter * u32::try_from(rank).unwrap_or(u32::MAX) / n
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stride_starts_evenly_spread_the_first_at_once_in_a_fixed_order() {
        let indices: Vec<u32> = (8..16).collect();
        let offsets_a = offsets("uid-a", &indices, Duration::from_secs(4));
        let mut sorted = offsets_a.clone();
        sorted.sort();
        let expected: Vec<Duration> = (0..8).map(|k| Duration::from_millis(500 * k)).collect();
        assert_eq!(sorted, expected, "k/n of the jitter, each once");
        assert_eq!(
            offsets("uid-a", &indices, Duration::from_secs(4)),
            offsets_a,
            "deterministic"
        );
        let other = offsets("uid-b", &indices, Duration::from_secs(4));
        assert_ne!(other, offsets_a, "another group, another order");
    }

    #[test]
    fn no_jitter_starts_everything_at_once() {
        assert!(
            offsets("u", &[0, 1, 2], Duration::ZERO)
                .iter()
                .all(|d| d.is_zero())
        );
        assert_eq!(
            offsets("u", &[], Duration::from_secs(1)),
            Vec::<Duration>::new()
        );
        assert_eq!(offsets("u", &[3], Duration::from_secs(5)), [Duration::ZERO]);
    }

    #[test]
    fn orders_are_spread_over_many_groups() {
        // Over 1,000 groups of a stride of 4, each index starts first about a quarter of the time.
        let mut first = [0u32; 4];
        for g in 0..1000 {
            let offsets = offsets(&format!("uid-{g}"), &[0, 1, 2, 3], Duration::from_secs(1));
            let k = offsets
                .iter()
                .position(|d| d.is_zero())
                .expect("one starts at once");
            first[k] += 1;
        }
        assert!(first.iter().all(|&n| (180..=320).contains(&n)), "{first:?}");
    }

    #[test]
    fn the_jitter_is_the_specs_or_one_second() {
        let mut spec: RolloutGroupSpec = serde_json::from_value(serde_json::json!({
            "template": {"spec": {"image": "busybox"}},
        }))
        .expect("spec");
        assert_eq!(jitter_of(&spec), DEFAULT_JITTER);
        for (given, expected) in [
            (0.0, 0),
            (2.5, 2500),
            (-1.0, 0),
            (600.0, 60_000),
            (f64::NAN, 0),
        ] {
            spec.launch_jitter_seconds = Some(given);
            assert_eq!(jitter_of(&spec), Duration::from_millis(expected), "{given}");
        }
    }
}
