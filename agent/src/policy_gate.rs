//! The network-policy gate. NetworkPolicy enforcers (kube-router, Calico, Cilium, ...) program a new
//! pod's rules asynchronously, some time after its network is up. Until then the pod reaches
//! everything, whatever its policies say. So, given canaries (`--egress-canary`: addresses that this
//! sandbox's policies deny and that accept connections otherwise, the API server's endpoints), the agent
//! serves nothing before a TCP connection to every canary has failed: `/healthz` answers 503 (the pod
//! is not Ready), every `/v1` request answers 503, and the startup command waits.
//!
//! The gate only opens, never closes again. Any failure to connect counts as denied: a rejection
//! (refused, unreachable, not permitted) or no answer within [`ProbeTiming::connect_timeout`] (an
//! enforcer that drops). A canary that is down therefore opens the gate as if enforced; the operator
//! names canaries that are up whenever the cluster works at all.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio::sync::watch;

/// How often and how patiently the canaries are tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeTiming {
    /// A connection not established in this long counts as denied.
    pub connect_timeout: Duration,
    /// Pause between rounds while a canary is still reached.
    pub retry_interval: Duration,
    /// A warning is logged this often while the policy is still not enforced.
    pub warn_every: Duration,
}

impl Default for ProbeTiming {
    fn default() -> Self {
        ProbeTiming {
            connect_timeout: Duration::from_millis(300),
            retry_interval: Duration::from_millis(50),
            warn_every: Duration::from_secs(10),
        }
    }
}

/// What one round of connections says (pure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Round {
    /// No canary accepted a connection: the sandbox's egress is enforced.
    Denied,
    /// This canary accepted one: the enforcer has not programmed the pod yet.
    Reached(SocketAddr),
}

/// The round's verdict from each canary's connection outcome, in order (`true`: connected).
pub fn round_verdict(outcomes: &[(SocketAddr, bool)]) -> Round {
    outcomes
        .iter()
        .find(|(_, connected)| *connected)
        .map_or(Round::Denied, |(address, _)| Round::Reached(*address))
}

/// Whether the sandbox's egress has been seen enforced; cheap to clone, shared by every handler.
#[derive(Debug, Clone)]
pub struct PolicyGate {
    open: watch::Receiver<bool>,
}

impl PolicyGate {
    /// A gate that is open from the start (no canaries: nothing to wait for).
    pub fn open() -> Self {
        let (_, open) = watch::channel(true);
        PolicyGate { open }
    }

    /// A gate that opens once no canary accepts a connection, probed by a task on the current
    /// runtime. Without canaries it is open at once.
    pub fn probing(canaries: Vec<SocketAddr>, timing: ProbeTiming) -> Self {
        if canaries.is_empty() {
            return Self::open();
        }
        let (opener, open) = watch::channel(false);
        tokio::spawn(probe_until_denied(canaries, timing, opener));
        PolicyGate { open }
    }

    /// Whether the gate has opened.
    pub fn is_open(&self) -> bool {
        *self.open.borrow()
    }

    /// Waits at most `limit` for the gate to open; whether it is open.
    pub async fn wait_open(&self, limit: Duration) -> bool {
        let mut open = self.open.clone();
        matches!(
            tokio::time::timeout(limit, open.wait_for(|open| *open)).await,
            Ok(Ok(_))
        )
    }

    /// Resolves when the gate opens (never, if the prober is gone without opening it).
    pub async fn opened(&self) {
        let mut open = self.open.clone();
        if open.wait_for(|open| *open).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Whether a TCP connection to `address` is established within `limit`.
async fn connects(address: SocketAddr, limit: Duration) -> bool {
    matches!(
        tokio::time::timeout(limit, TcpStream::connect(address)).await,
        Ok(Ok(_))
    )
}

async fn probe_until_denied(
    canaries: Vec<SocketAddr>,
    timing: ProbeTiming,
    opener: watch::Sender<bool>,
) {
    let started = Instant::now();
    let mut warned = started;
    let mut rounds: u64 = 0;
    loop {
        rounds += 1;
        let mut outcomes = Vec::with_capacity(canaries.len());
        for &address in &canaries {
            let connected = connects(address, timing.connect_timeout).await;
            outcomes.push((address, connected));
            if connected {
                break;
            }
        }
        match round_verdict(&outcomes) {
            Round::Denied => {
                tracing::info!(
                    after_ms = started.elapsed().as_millis() as u64,
                    rounds,
                    canaries = ?canaries,
                    "network policy enforced: no canary accepts a connection; serving"
                );
                let _ = opener.send(true);
                return;
            }
            Round::Reached(address) => {
                if warned.elapsed() >= timing.warn_every {
                    warned = Instant::now();
                    tracing::warn!(
                        after_s = started.elapsed().as_secs(),
                        %address,
                        "network policy not enforced yet: the sandbox still reaches a canary its policies deny; \
                         not serving (is a NetworkPolicy enforcer running in this cluster?)"
                    );
                }
            }
        }
        tokio::time::sleep(timing.retry_interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(text: &str) -> SocketAddr {
        text.parse().expect("address")
    }

    fn fast() -> ProbeTiming {
        ProbeTiming {
            connect_timeout: Duration::from_millis(200),
            retry_interval: Duration::from_millis(10),
            warn_every: Duration::from_secs(60),
        }
    }

    #[test]
    fn a_round_is_denied_only_when_no_canary_connects() {
        assert_eq!(round_verdict(&[]), Round::Denied);
        assert_eq!(
            round_verdict(&[(a("10.0.0.1:6443"), false), (a("10.0.0.2:6443"), false)]),
            Round::Denied
        );
        assert_eq!(
            round_verdict(&[(a("10.0.0.1:6443"), false), (a("10.0.0.2:6443"), true)]),
            Round::Reached(a("10.0.0.2:6443"))
        );
    }

    #[tokio::test]
    async fn without_canaries_the_gate_is_open() {
        assert!(PolicyGate::probing(Vec::new(), fast()).is_open());
        assert!(PolicyGate::open().wait_open(Duration::ZERO).await);
    }

    #[tokio::test]
    async fn the_gate_stays_closed_while_a_canary_answers_and_opens_once_it_refuses() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("listener");
        let canary = listener.local_addr().expect("address");
        // Accept and drop, as a TLS server does with a connection that sends nothing.
        let server = tokio::spawn(async move {
            loop {
                if let Ok((stream, _)) = listener.accept().await {
                    drop(stream);
                }
            }
        });
        let gate = PolicyGate::probing(vec![canary], fast());
        assert!(
            !gate.wait_open(Duration::from_millis(300)).await,
            "open while the canary accepts connections"
        );
        // The "enforcer" arrives: the canary refuses from now on.
        server.abort();
        let _ = server.await;
        assert!(
            gate.wait_open(Duration::from_secs(5)).await,
            "still closed after the canary went away"
        );
        // It never closes again.
        assert!(gate.is_open());
    }

    #[tokio::test]
    async fn an_unreachable_canary_counts_as_denied() {
        // Nothing listens on a port the kernel just handed out and took back: refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let gate = PolicyGate::probing(vec![a(&format!("127.0.0.1:{port}"))], fast());
        assert!(gate.wait_open(Duration::from_secs(5)).await);
    }
}
