use super::*;

fn outcome(ok: bool, ready_ms: f64) -> Outcome {
    Outcome {
        ok,
        ready_ms,
        ..Outcome::default()
    }
}

#[test]
fn each_round_gets_its_own_row() {
    let rounds = [
        Round {
            outcomes: vec![outcome(true, 1000.0), outcome(true, 3000.0)],
            end_to_end: Duration::from_millis(20_500),
            cleaned: Duration::from_secs(22),
            operator_writes: 6.0,
            all_writes: 16.0,
            cpu: BTreeMap::from([("etcd".into(), 10.0), ("kube-apiserver".into(), 20.0)]),
            machine_busy: Some(41.0),
            machine: "quiet".into(),
        },
        Round {
            outcomes: vec![outcome(true, 2000.0), outcome(false, 0.0)],
            end_to_end: Duration::from_secs(30),
            cleaned: Duration::from_secs(31),
            operator_writes: 6.0,
            all_writes: 18.0,
            cpu: BTreeMap::new(),
            machine_busy: None,
            machine: "noisy".into(),
        },
    ];
    let table = round_table(&rounds, 2);
    let rows: Vec<&str> = table.lines().skip(2).collect();
    assert_eq!(
        rows,
        [
            "| 1 | 2/2 | 20.5 s | 22.0 s | 3.00 s | 8.00 | 30.0; 41.0 | quiet |",
            "| 2 | 1/2 | 30.0 s | 31.0 s | 2.00 s | 9.00 | 0.0; — | noisy |",
        ]
    );
}

fn cpu_round(cpu: &[(&str, f64)], machine_busy: Option<f64>) -> Round {
    Round {
        outcomes: Vec::new(),
        end_to_end: Duration::from_secs(20),
        cleaned: Duration::from_secs(22),
        operator_writes: 0.0,
        all_writes: 0.0,
        cpu: cpu.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        machine_busy,
        machine: String::new(),
    }
}

#[test]
fn the_cpu_table_averages_components_and_shows_what_none_accounts_for() {
    let rounds = [
        cpu_round(
            &[("kube-apiserver", 18.0), (SANDBOX_PROCESSES, 10.0)],
            Some(40.0),
        ),
        cpu_round(
            &[("kube-apiserver", 20.0), (SANDBOX_PROCESSES, 12.0)],
            Some(44.0),
        ),
    ];
    let (table, rows, machine) = cpu_table(&rounds, 22.0, 2);
    assert_eq!(
        rows,
        [
            ("kube-apiserver".to_string(), 19.0),
            (SANDBOX_PROCESSES.to_string(), 11.0)
        ]
    );
    assert_eq!(machine, Some(42.0));
    let lines: Vec<&str> = table.lines().skip(2).collect();
    assert_eq!(
        lines,
        [
            "| kube-apiserver | 19.0 | 63 % |",
            "| sandboxes' processes (agent installs, agents, their commands) | 11.0 | 37 % |",
            "| **total** (2 cores x 22 s, the mean round = 44 core-seconds available) | 30.0 | |",
            "| the whole machine busy (`/proc/stat`: every process and the kernel) | 42.0 | |",
            "| of it not in a component above (kernel threads, interrupts, processes outside the cluster) | 12.0 | 29 % of the machine |",
        ]
    );
    // One round without the machine's figure: no machine rows rather than a skewed mean.
    let partial = [cpu_round(&[("etcd", 1.0)], Some(5.0)), cpu_round(&[], None)];
    let (table, _, machine) = cpu_table(&partial, 10.0, 2);
    assert_eq!(machine, None);
    assert!(!table.contains("whole machine"));
}
