//! Every decision of a queue loop pass, as tables: inputs in, plan out, no API server.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::queue::order::Request;
use orchard_api::{AdmissionOrder, RolloutQueueSpec};

fn at(s: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + s).expect("a time")
}

fn request(group: &str, since: i64) -> Request {
    Request {
        uid: group.into(),
        group: group.into(),
        created: at(0),
        last_admitted: None,
        since: at(since),
        count: 8,
    }
}

fn queue() -> RolloutQueue {
    let mut queue = RolloutQueue::new(
        "q",
        RolloutQueueSpec {
            max_running_trajectories: 16,
            admission: AdmissionOrder::Fair,
        },
    );
    queue.metadata.generation = Some(2);
    queue
}

#[test]
fn the_status_counts_slots_and_lists_waiting_strides_in_order() {
    let mut queue = queue();
    let view = QueueView {
        used: 12,
        waiting: vec![request("b", 30), request("a", 10)],
    };
    let status = queue_status(&queue, &view, at(40));
    assert_eq!(status.running_trajectories, 12);
    assert_eq!(status.waiting_groups, 2);
    assert_eq!(status.waiting_trajectories, 16);
    assert_eq!(status.oldest_waiting_since, Some(Time(at(10))));
    assert_eq!(status.waiting[0].group, "b", "admission order is kept");
    assert_eq!(status.observed_generation, Some(2));
    queue.status = Some(status.clone());
    assert_eq!(
        queue_status(&queue, &view, at(50)),
        status,
        "the same view gives the same status: no write"
    );
}

#[test]
fn the_status_lists_the_first_waiting_strides_and_counts_them_all() {
    let view = QueueView {
        used: 16,
        waiting: (0..25).map(|i| request(&format!("g{i:02}"), i)).collect(),
    };
    let status = queue_status(&queue(), &view, at(40));
    assert_eq!(status.waiting.len(), LISTED_WAITING);
    assert_eq!(status.waiting[0].group, "g00");
    assert_eq!(status.waiting_groups, 25);
    assert_eq!(status.waiting_trajectories, 200);
    let active = status
        .conditions
        .iter()
        .find(|c| c.type_ == ACTIVE)
        .expect("Active");
    assert_eq!(
        (active.status.as_str(), active.reason.as_str()),
        ("True", "Admitting")
    );
    assert_eq!(active.message, "16 of 16 slots in use, 25 groups waiting");
}

#[test]
fn the_gauges_count_slots_strides_and_their_trajectories() {
    let cases: Vec<(&str, QueueView, Gauges)> = vec![
        (
            "an idle queue",
            QueueView {
                used: 0,
                waiting: vec![],
            },
            Gauges {
                running: 0,
                waiting_groups: 0,
                waiting_trajectories: 0,
            },
        ),
        (
            "a busy queue",
            QueueView {
                used: 12,
                waiting: vec![request("b", 30), request("a", 10)],
            },
            Gauges {
                running: 12,
                waiting_groups: 2,
                waiting_trajectories: 16,
            },
        ),
    ];
    for (case, view, expected) in cases {
        assert_eq!(gauges(&view), expected, "{case}");
    }
}

/// A row of the write table: case, the queue, leadership, time since the last write, the step.
type WriteRow<'a> = (
    &'a str,
    Option<&'a RolloutQueue>,
    bool,
    Option<Duration>,
    StatusStep,
);

#[test]
fn the_status_is_written_when_it_changed_at_most_once_a_second() {
    let view = QueueView {
        used: 12,
        waiting: vec![request("a", 10)],
    };
    let current = {
        let mut q = queue();
        q.status = Some(queue_status(&q, &view, at(40)));
        q
    };
    let stale = queue();
    let deleting = {
        let mut q = queue();
        q.metadata.deletion_timestamp = Some(Time(at(30)));
        q
    };
    let ms = Duration::from_millis;
    let write = StatusStep::Write(Box::new(queue_status(&stale, &view, at(40))));
    let cases: Vec<WriteRow> = vec![
        ("no such queue", None, true, None, StatusStep::Keep),
        (
            "a standby replica",
            Some(&stale),
            false,
            None,
            StatusStep::Keep,
        ),
        (
            "being deleted",
            Some(&deleting),
            true,
            None,
            StatusStep::Keep,
        ),
        ("unchanged", Some(&current), true, None, StatusStep::Keep),
        (
            "unchanged, written moments ago",
            Some(&current),
            true,
            Some(ms(300)),
            StatusStep::Keep,
        ),
        (
            "changed, never written",
            Some(&stale),
            true,
            None,
            write.clone(),
        ),
        (
            "changed, written moments ago",
            Some(&stale),
            true,
            Some(ms(300)),
            StatusStep::HoldBack(ms(700)),
        ),
        (
            "changed, written a second ago",
            Some(&stale),
            true,
            Some(STATUS_INTERVAL),
            write.clone(),
        ),
        (
            "changed, written long ago",
            Some(&stale),
            true,
            Some(ms(5_000)),
            write,
        ),
    ];
    for (case, queue, leader, since, expected) in cases {
        let plan = decide(queue, &view, leader, since, at(40));
        assert_eq!(plan.status, expected, "{case}");
        assert_eq!(plan.gauges, gauges(&view), "{case}: the gauges always");
    }
}
