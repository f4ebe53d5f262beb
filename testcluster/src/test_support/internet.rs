//! The chart on a real node whose egress proxy resolves host names through a fake internet's DNS
//! server (`crate::fake_internet`): what the egress and Harbor tests start from.

use crate::chart_install::{ChartRelease, ReleaseOptions};
use crate::env::TestEnv;
use crate::fake_internet::FakeInternet;

/// A fake internet of `names`, and the chart (one operator replica) with its egress proxy pointed at
/// that internet's DNS server.
pub struct InternetRelease {
    /// The chart's release (dropped first).
    pub release: ChartRelease,
    /// The fake internet.
    pub internet: FakeInternet,
    /// The gateway through its Service.
    pub gateway: String,
}

/// The chart values that make the egress proxy resolve through `internet`'s DNS server (pure).
pub fn egress_dns_values(internet: &FakeInternet) -> Vec<(String, String)> {
    vec![
        ("egress.dnsPolicy".into(), "None".into()),
        (
            "egress.dnsConfig.nameservers[0]".into(),
            internet.dns().to_string(),
        ),
    ]
}

/// Starts a fake internet of `names` on `env`'s real node and installs the chart with its egress
/// proxy resolving through it; panics with the reason when either cannot start.
pub async fn install(env: &TestEnv, names: &[&str]) -> InternetRelease {
    let internet = FakeInternet::start(env.node.real(), names)
        .await
        .unwrap_or_else(|e| panic!("fake internet: {e}"));
    let options = ReleaseOptions {
        replicas: 1,
        values: egress_dns_values(&internet),
        ..ReleaseOptions::default()
    };
    let release = ChartRelease::install(env, &options)
        .await
        .unwrap_or_else(|e| panic!("helm install: {e}"));
    let client = env.client().await;
    let gateway = release.gateway_url(&client).await.expect("gateway url");
    InternetRelease {
        internet,
        release,
        gateway,
    }
}
