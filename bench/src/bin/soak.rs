//! `make soak`: name churn for minutes on the local cluster. Sandboxes and RolloutGroups are created,
//! deleted and recreated under the same names (50 of each by default) for `--seconds` (default 600);
//! then every final incarnation must settle. Prints stuck objects, leaked children, operator writes per
//! incarnation and the operator's memory over time; exits non-zero if anything got stuck or leaked.
//!
//! ```text
//! soak [--seconds N] [--names N] [--seed N]
//! ```

use std::time::{Duration, Instant};

use orchard_testcluster::churn::{self, Churn, Kind};
use orchard_testcluster::env::{EnvOptions, TestEnv};
use orchard_testcluster::operator_process::metric_sum;
use orchard_testcluster::proc_stats::rss_bytes;

fn usage() -> ! {
    eprintln!("usage: soak [--seconds N] [--names N] [--seed N]");
    std::process::exit(2);
}

fn number(value: Option<String>) -> u64 {
    value
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| usage())
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or_else(|| "?".into(), |b| format!("{:.1}", b as f64 / 1048576.0))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let (mut seconds, mut names, mut seed) = (600, 50, 20_261_124);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => seconds = number(args.next()),
            "--names" => names = number(args.next()),
            "--seed" => seed = number(args.next()),
            _ => usage(),
        }
    }
    let env = match TestEnv::start("soak", EnvOptions::default()).await {
        Ok(env) => env,
        Err(err) => {
            eprintln!("soak: the local cluster did not start: {err}");
            std::process::exit(1);
        }
    };
    let client = env.client().await;
    let operator = env.operator();
    let writes = |text: &str| metric_sum(text, "orchard_api_writes_total", &[]);
    let before = writes(&operator.metrics().await.unwrap_or_default());
    let rss_start = operator.pid().and_then(rss_bytes);
    println!(
        "soak: {names} Sandbox names and {names} RolloutGroup names, {seconds} s, seed {seed}; operator RSS {} MiB",
        mib(rss_start)
    );

    let duration = Duration::from_secs(seconds);
    let config = |kind| Churn {
        kind,
        names: usize::try_from(names).unwrap_or(50),
        rounds: 0,
        duration: Some(duration),
        seed,
        settle: Duration::from_secs(180),
    };
    let sandboxes_ns = env.namespace("soak-sbx").await;
    let groups_ns = env.namespace("soak-rg").await;
    let started = Instant::now();
    let sampler = {
        let pid = operator.pid();
        tokio::spawn(async move {
            let mut samples = Vec::new();
            while started.elapsed() < duration {
                tokio::time::sleep(Duration::from_secs(30)).await;
                let rss = pid.and_then(rss_bytes);
                println!(
                    "soak: {:>4} s: operator RSS {} MiB",
                    started.elapsed().as_secs(),
                    mib(rss)
                );
                samples.push(rss);
            }
            samples
        })
    };
    let (sandbox_churn, group_churn) = (config(Kind::Sandboxes), config(Kind::RolloutGroups));
    let (sandboxes, groups) = tokio::join!(
        churn::run(&client, &sandboxes_ns, &sandbox_churn),
        churn::run(&client, &groups_ns, &group_churn),
    );
    let samples = sampler.await.unwrap_or_default();
    let after = writes(&operator.metrics().await.unwrap_or_default());
    let rss_end = operator.pid().and_then(rss_bytes);

    let incarnations = sandboxes.incarnations + groups.incarnations;
    println!(
        "\nsoak results ({} s of churn):",
        started.elapsed().as_secs()
    );
    for (kind, report) in [("Sandboxes", &sandboxes), ("RolloutGroups", &groups)] {
        println!("  {kind}: {:?}", churn::summary(report));
        for line in report
            .stuck
            .iter()
            .chain(&report.stuck_during_churn)
            .chain(&report.wrong_owner)
            .chain(&report.leaks)
        {
            println!("    {line}");
        }
    }
    println!(
        "  operator writes: {:.0} in all, {:.2} per incarnation",
        after - before,
        (after - before) / incarnations.max(1) as f64
    );
    let first_sample = samples.first().copied().flatten();
    println!(
        "  operator RSS: {} MiB at start, {} MiB after 30 s, {} MiB at the end (growth after warm-up: {} MiB)",
        mib(rss_start),
        mib(first_sample),
        mib(rss_end),
        match (first_sample, rss_end) {
            (Some(a), Some(b)) => format!("{:+.1}", (b as f64 - a as f64) / 1048576.0),
            _ => "?".into(),
        }
    );
    env.stop().await;
    if !(sandboxes.clean() && groups.clean()) {
        eprintln!("soak: FAILED (stuck, leaked or wrongly owned objects above)");
        std::process::exit(1);
    }
    println!("soak: passed");
}
