//! The tests' fake internet: web hosts under names that a DNS server of the test answers, behind the
//! real node, for egress tests (a proxy pod that resolves and connects to outside hosts; sandboxes
//! that must not reach them unless a NetworkPolicy allows it). See `docs/TESTING.md`, "The fake
//! internet".
//!
//! One network namespace of its own (held, like the node's, by `unshare` running `orchard-pause` as
//! PID 1 of a PID namespace) hangs off the node's network namespace by a veth pair, like the uplink of
//! a real node; nothing of it is in the host's namespace:
//!
//! ```text
//!  node netns                                          fake internet netns
//!  fi<pid>n 198.18.0.1/30  <----- veth pair ----->  fi<pid>i 198.18.0.2/30
//!  route 198.18.0.0/15 via 198.18.0.2                  + 198.18.0.53/32 (dnsmasq, :53 UDP and TCP)
//!                                                      + 198.18.1.<i+1>/32 per name (:80, :443)
//!                                                      routes back: the pod subnet and the node's
//!                                                      address via 198.18.0.1, nothing else
//! ```
//!
//! Pods route through the node (their bridge's gateway), so their packets to these addresses cross the
//! node's FORWARD chain, where kube-router enforces NetworkPolicies when the test asks for it. The
//! addresses come from 198.18.0.0/15 (RFC 2544, benchmarking), which no pod, Service or node range
//! of the harness uses (`real_node::layout`); every node has its own namespace, so two runs never
//! share them.
//!
//! DNS is dnsmasq (`dnsmasq-base`): an A record for each name and nothing else (`--host-record`;
//! every other name is NXDOMAIN, `--local=/#/`; no upstream, no `/etc/hosts`). The hosts are one Python
//! standard-library process (`testcluster/fake-internet/hosts.py`), with certificates the `openssl`
//! command signs with a CA made for this fake internet alone.
//!
//! Cleanup: [`Drop`] deletes the veth pair (the node's route goes with it), kills the servers and the
//! namespace's holder (the namespace goes with its last process) and removes the working directory
//! (keys, certificates, configuration); the logs stay in the node's log directory. If the harness
//! dies instead, the parent-death signal kills `unshare`, which kills PID 1 and with it every process
//! in the namespace; every process also carries the run marker the start-time sweep kills
//! (`supervise::sweep_orphans`), and the working directory is under the run's directory, which the
//! sweep of dead runs removes.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::binaries::node_bin;
use crate::error::{E2eError, Result};
use crate::real_node::RealNode;
use crate::real_node::namespaces::{only_child, run};
use crate::supervise::{Child, Spec};

/// The whole fake internet, routed from the node to its namespace.
pub const RANGE: &str = "198.18.0.0/15";
/// The node's end of the veth pair (a /30).
pub const NODE_END: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// The fake internet's end of the veth pair.
pub const INTERNET_END: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
/// The DNS server (dnsmasq, port 53, UDP and TCP).
pub const DNS: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 53);
/// At most this many names (198.18.1.1 to 198.18.1.250).
pub const MAX_NAMES: usize = 250;

const DNSMASQ: &str = "/usr/sbin/dnsmasq";
/// The web hosts' server, written into the working directory at start.
const HOSTS_PY: &str = include_str!("../fake-internet/hosts.py");
/// How long the servers may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// The address of the `index`th name (pure).
pub fn host_address(index: usize) -> Ipv4Addr {
    let last = u8::try_from(index + 1).unwrap_or(u8::MAX);
    Ipv4Addr::new(198, 18, 1, last)
}

/// The veth pair's names for harness process `pid`: the node's end and the fake internet's (pure;
/// at most 15 bytes each).
pub fn link_names(pid: u32) -> (String, String) {
    (format!("fi{pid}n"), format!("fi{pid}i"))
}

/// Why `name` cannot be a host of the fake internet, if it cannot: DNS labels of lower-case letters,
/// digits and hyphens (what dnsmasq, a certificate and the server's body all take as they are) (pure).
pub fn invalid_name(name: &str) -> Option<String> {
    let labels_ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        });
    (!labels_ok)
        .then(|| format!("{name:?} is not a lower-case DNS name (letters, digits, hyphens, dots)"))
}

/// dnsmasq's command line: in the foreground, no configuration file, no pid file, no privilege drop
/// (which would also drop the parent-death signal), on [`DNS`] alone, an A record for each host and
/// NXDOMAIN for every other name, every query logged to stderr (pure).
pub fn dnsmasq_args(hosts: &[(String, Ipv4Addr)]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--keep-in-foreground",
        "--conf-file=/dev/null",
        "--pid-file",
        "--user=root",
        "--no-resolv",
        "--no-hosts",
        "--bind-dynamic",
        "--port=53",
        "--local=/#/",
        "--log-queries",
        "--log-facility=-",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    args.push(format!("--listen-address={DNS}"));
    for (name, address) in hosts {
        args.push(format!("--host-record={name},{address}"));
    }
    args
}

/// The `openssl` configuration of the CA (`ca`) and host (`host`, its name from the environment's
/// `FAKE_INTERNET_NAME`) certificates: what strict verifiers (Python 3.13's `VERIFY_X509_STRICT`,
/// webpki) require: a critical CA basic constraint, key identifiers, a serverAuth host certificate
/// whose name is in its subjectAltName (pure).
pub const OPENSSL_CONFIG: &str = "\
[req]
distinguished_name = dn
[dn]
[ca]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[host]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
subjectAltName = DNS:$ENV::FAKE_INTERNET_NAME
";

/// The fake internet of one test: its namespace, DNS server and web hosts. Dropping it removes it.
pub struct FakeInternet {
    hosts: Vec<(String, Ipv4Addr)>,
    ca_pem: String,
    dir: PathBuf,
    node_init_pid: u32,
    node_link: String,
    holder: Option<Child>,
    servers: Vec<Child>,
}

impl FakeInternet {
    /// What is missing for a fake internet on this machine, if anything, as a sentence.
    pub fn unavailable() -> Option<String> {
        if !Path::new(DNSMASQ).exists() {
            return Some(format!(
                "{DNSMASQ} is missing: install dnsmasq-base (make node-deps)"
            ));
        }
        for (program, package) in [("openssl", "openssl"), ("python3", "python3")] {
            if Command::new(program).arg("--version").output().is_err() {
                return Some(format!(
                    "{program} is missing: install {package} (make node-deps)"
                ));
            }
        }
        None
    }

    /// Starts hosts `names` (each on its own address, [`host_address`] in the order given) in a fresh
    /// network namespace routed from `node`'s, and the DNS server at [`DNS`] answering exactly those
    /// names. Every host serves HTTP on :80 and HTTPS on :443 (a certificate for its name from
    /// [`ca_pem`](Self::ca_pem)); see `testcluster/fake-internet/hosts.py` for what they answer. One
    /// fake internet per node at a time.
    pub async fn start(node: &RealNode, names: &[&str]) -> Result<FakeInternet> {
        if let Some(why) = Self::unavailable() {
            return Err(E2eError::Setup(format!("no fake internet here: {why}")));
        }
        if names.is_empty() || names.len() > MAX_NAMES {
            return Err(E2eError::Setup(format!(
                "a fake internet has 1 to {MAX_NAMES} names, not {}",
                names.len()
            )));
        }
        let mut hosts = Vec::new();
        for (index, name) in names.iter().enumerate() {
            if let Some(why) = invalid_name(name) {
                return Err(E2eError::Setup(why));
            }
            if hosts.iter().any(|(known, _)| known == name) {
                return Err(E2eError::Setup(format!("{name} is named twice")));
            }
            hosts.push((name.to_string(), host_address(index)));
        }
        let (node_link, internet_link) = link_names(std::process::id());
        let node_init_pid = node.namespaces.init_pid;
        let exists = Command::new("nsenter")
            .args(["--target", &node_init_pid.to_string(), "--net", "--"])
            .args(["ip", "link", "show", &node_link])
            .output()
            .is_ok_and(|o| o.status.success());
        if exists {
            return Err(E2eError::Setup(format!(
                "a fake internet already runs on this node ({node_link} exists): one at a time"
            )));
        }
        let dir = node.namespaces.layout.path("fake-internet");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let mut internet = FakeInternet {
            hosts,
            ca_pem: String::new(),
            dir,
            node_init_pid,
            node_link,
            holder: None,
            servers: Vec::new(),
        };
        // From here on, an error drops `internet`, which removes whatever was made.
        let (dir, hosts) = (internet.dir.clone(), internet.hosts.clone());
        internet.ca_pem = tokio::task::spawn_blocking(move || make_certificates(&dir, &hosts))
            .await
            .map_err(|e| E2eError::Setup(format!("making the certificates: {e}")))??;

        let holder = Child::spawn(
            Spec::new("fake-internet", "unshare")
                .args(["--net", "--pid", "--fork", "--kill-child", "--"])
                .args([node_bin("orchard-pause")?.into_os_string()])
                .log(node.logs.join("fake-internet-namespace.log")),
        )?;
        let holder_pid = holder.pid();
        internet.holder = Some(holder);
        let init = only_child(holder_pid, Duration::from_secs(10))?;
        internet.wire(init, &internet_link, &node.namespaces.layout)?;

        let config = internet.dir.join("hosts.json");
        std::fs::write(internet.dir.join("hosts.py"), HOSTS_PY)?;
        std::fs::write(&config, internet.hosts_config())?;
        let hosts_log = node.logs.join("fake-internet-hosts.log");
        let dns_log = node.logs.join("fake-internet-dns.log");
        for log in [&hosts_log, &dns_log] {
            let _ = std::fs::remove_file(log);
        }
        let python = python3();
        internet.spawn_inside(
            init,
            "fake-internet-hosts",
            &python,
            &[
                internet.dir.join("hosts.py").display().to_string(),
                config.display().to_string(),
            ],
            &hosts_log,
        )?;
        internet.spawn_inside(
            init,
            "fake-internet-dns",
            DNSMASQ,
            &dnsmasq_args(&internet.hosts),
            &dns_log,
        )?;
        internet
            .wait_listening(&internet.dir.join("ready"), &hosts_log, &dns_log)
            .await?;
        internet.check_from_node(&python)?;
        Ok(internet)
    }

    /// The DNS server's address (port 53, UDP and TCP).
    pub fn dns(&self) -> Ipv4Addr {
        DNS
    }

    /// The address of host `name` (`None` for a name this fake internet does not have).
    pub fn address(&self, name: &str) -> Option<Ipv4Addr> {
        self.hosts
            .iter()
            .find(|(known, _)| known == name)
            .map(|(_, address)| *address)
    }

    /// The names and addresses, in the order given to [`start`](Self::start).
    pub fn hosts(&self) -> &[(String, Ipv4Addr)] {
        &self.hosts
    }

    /// The test CA's certificate (PEM), which signed every host's.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The same certificate as a file (for `curl --cacert` in the node's namespace; gone on drop).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The veth pair, its addresses and routes (in the fake internet's namespace, whose PID 1 is
    /// `init`, and in the node's). Back towards the node only the pod subnet and the node's own
    /// address are routed: the fake internet answers the node and its pods, and sends nothing beyond.
    fn wire(
        &self,
        init: u32,
        internet_link: &str,
        layout: &crate::real_node::Layout,
    ) -> Result<()> {
        let node = self.node_init_pid.to_string();
        let end = |ip: Ipv4Addr| format!("{ip}/30");
        let back = NODE_END.to_string();
        let node_ip = format!("{}/32", layout.node_ip);
        let pod_cidr = layout.pod_cidr();
        let mut internet_steps: Vec<(&str, Vec<String>)> = vec![
            (
                "creating the veth pair",
                strings(&[
                    "link",
                    "add",
                    internet_link,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    &self.node_link,
                    "netns",
                    &node,
                ]),
            ),
            ("loopback", strings(&["link", "set", "lo", "up"])),
            (
                "the link's address",
                strings(&["addr", "add", &end(INTERNET_END), "dev", internet_link]),
            ),
        ];
        let dns = format!("{DNS}/32");
        internet_steps.push((
            "the DNS server's address",
            strings(&["addr", "add", &dns, "dev", internet_link]),
        ));
        for (_, address) in &self.hosts {
            internet_steps.push((
                "a host's address",
                strings(&[
                    "addr",
                    "add",
                    &format!("{address}/32"),
                    "dev",
                    internet_link,
                ]),
            ));
        }
        internet_steps.extend([
            (
                "the link up",
                strings(&["link", "set", internet_link, "up"]),
            ),
            (
                "the route back to the pods",
                strings(&["route", "add", &pod_cidr, "via", &back]),
            ),
            (
                "the route back to the node",
                strings(&["route", "add", &node_ip, "via", &back]),
            ),
        ]);
        for (what, args) in &internet_steps {
            ip_in(init, what, args)?;
        }
        let gateway = INTERNET_END.to_string();
        for (what, args) in [
            (
                "the node's end of the link",
                strings(&["addr", "add", &end(NODE_END), "dev", &self.node_link]),
            ),
            (
                "the node's end up",
                strings(&["link", "set", &self.node_link, "up"]),
            ),
            (
                "the node's route to the fake internet",
                strings(&[
                    "route",
                    "add",
                    RANGE,
                    "via",
                    &gateway,
                    "dev",
                    &self.node_link,
                ]),
            ),
        ] {
            ip_in(self.node_init_pid, what, &args)?;
        }
        Ok(())
    }

    /// hosts.py's configuration (JSON).
    fn hosts_config(&self) -> String {
        let hosts: Vec<serde_json::Value> = self
            .hosts
            .iter()
            .map(|(name, address)| {
                serde_json::json!({
                    "name": name,
                    "address": address.to_string(),
                    "cert": self.dir.join(format!("{name}.pem")).display().to_string(),
                    "key": self.dir.join(format!("{name}.key")).display().to_string(),
                })
            })
            .collect();
        serde_json::json!({
            "ready": self.dir.join("ready").display().to_string(),
            "hosts": hosts,
        })
        .to_string()
    }

    /// Starts `program` in the fake internet's network and PID namespaces (`nsenter` forks it there and
    /// waits for it: killing the supervised process group kills both).
    fn spawn_inside(
        &mut self,
        init: u32,
        name: &str,
        program: &str,
        args: &[String],
        log: &Path,
    ) -> Result<()> {
        let child = Child::spawn(
            Spec::new(name, "nsenter")
                .args([
                    "--target".to_string(),
                    init.to_string(),
                    "--net".to_string(),
                    "--pid".to_string(),
                    "--".to_string(),
                    program.to_string(),
                ])
                .args(args.iter().cloned())
                .log(log),
        )?;
        self.servers.push(child);
        Ok(())
    }

    /// Waits until hosts.py has bound every listener (it writes `ready`) and dnsmasq has started (it
    /// logs `started` once its sockets are bound).
    async fn wait_listening(&self, ready: &Path, hosts_log: &Path, dns_log: &Path) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let dns_started =
                std::fs::read_to_string(dns_log).is_ok_and(|log| log.contains("started, version"));
            if ready.exists() && dns_started {
                return Ok(());
            }
            if let Some(dead) = self.servers.iter().find(|c| c.has_exited()) {
                return Err(E2eError::Setup(format!(
                    "{} exited while starting: {}",
                    dead.name(),
                    tail(if dead.name().ends_with("dns") {
                        dns_log
                    } else {
                        hosts_log
                    })
                )));
            }
            if Instant::now() >= deadline {
                return Err(E2eError::NotReady {
                    component: "fake internet".into(),
                    seconds: START_TIMEOUT.as_secs(),
                    detail: format!(
                        "hosts ready: {}, dnsmasq started: {dns_started} (logs: {}, {})",
                        ready.exists(),
                        hosts_log.display(),
                        dns_log.display()
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Connects from the node's network namespace to every listener (TCP: each host's 80 and 443,
    /// the DNS server's 53): the wiring works as pods will use it.
    fn check_from_node(&self, python: &str) -> Result<()> {
        let mut targets = vec![(DNS, 53)];
        for (_, address) in &self.hosts {
            targets.extend([(*address, 80), (*address, 443)]);
        }
        let targets = targets
            .iter()
            .map(|(ip, port)| format!("('{ip}', {port})"))
            .collect::<Vec<_>>()
            .join(", ");
        let script = format!(
            "import socket\nfor target in [{targets}]:\n    socket.create_connection(target, 5).close()\n"
        );
        run(
            "connecting to the fake internet from the node",
            Command::new("nsenter")
                .args(["--target", &self.node_init_pid.to_string(), "--net", "--"])
                .args([python, "-c", &script]),
        )?;
        Ok(())
    }
}

impl Drop for FakeInternet {
    fn drop(&mut self) {
        // The pair goes as one, and the node's route through it with it.
        let _ = Command::new("nsenter")
            .args(["--target", &self.node_init_pid.to_string(), "--net", "--"])
            .args(["ip", "link", "del", &self.node_link])
            .output();
        for server in &self.servers {
            server.kill_now();
        }
        if let Some(holder) = &self.holder {
            holder.kill_now();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

/// `ip ARGS` in the network namespace of process `pid` (the host's mount namespace: its `/proc`
/// shows every pid, which `ip link ... netns PID` needs).
fn ip_in(pid: u32, what: &str, args: &[String]) -> Result<()> {
    run(
        &format!("fake internet: {what}"),
        Command::new("nsenter")
            .args(["--target", &pid.to_string(), "--net", "--", "ip"])
            .args(args),
    )?;
    Ok(())
}

/// Debian's own interpreter when there is one (a pyenv shim also works, only slower to start).
fn python3() -> String {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3".into()
    } else {
        "python3".into()
    }
}

/// The CA (`ca.pem`, `ca.key`) and, for each host, `<name>.pem` and `<name>.key` in `dir` (P-256 keys,
/// valid for two days); returns the CA certificate.
fn make_certificates(dir: &Path, hosts: &[(String, Ipv4Addr)]) -> Result<String> {
    let config = dir.join("openssl.cnf");
    std::fs::write(&config, OPENSSL_CONFIG)?;
    let path = |file: &str| dir.join(file).display().to_string();
    let openssl = |what: &str, name: &str, args: &[String]| -> Result<()> {
        run(
            what,
            Command::new("openssl")
                .args(args)
                .env("FAKE_INTERNET_NAME", name)
                .current_dir(dir),
        )
        .map(|_| ())
    };
    let key_options = strings(&[
        "-config",
        &path("openssl.cnf"),
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-noenc",
    ]);
    let subject = format!("/CN=Orchard fake internet test CA {}", std::process::id());
    let mut ca = strings(&["req", "-x509", "-new", "-extensions", "ca", "-days", "2"]);
    ca.extend(key_options.iter().cloned());
    ca.extend(strings(&[
        "-keyout",
        &path("ca.key"),
        "-out",
        &path("ca.pem"),
        "-subj",
        &subject,
    ]));
    openssl("making the fake internet's CA", "-", &ca)?;
    for (serial, (name, _)) in hosts.iter().enumerate() {
        let mut request = strings(&["req", "-new"]);
        request.extend(key_options.iter().cloned());
        request.extend(strings(&[
            "-keyout",
            &path(&format!("{name}.key")),
            "-out",
            &path(&format!("{name}.csr")),
            "-subj",
            &format!("/CN={name}"),
        ]));
        openssl(&format!("a key for {name}"), name, &request)?;
        let sign = strings(&[
            "x509",
            "-req",
            "-in",
            &path(&format!("{name}.csr")),
            "-CA",
            &path("ca.pem"),
            "-CAkey",
            &path("ca.key"),
            "-set_serial",
            &(serial + 2).to_string(),
            "-days",
            "2",
            "-extfile",
            &path("openssl.cnf"),
            "-extensions",
            "host",
            "-out",
            &path(&format!("{name}.pem")),
        ]);
        openssl(&format!("signing {name}'s certificate"), name, &sign)?;
    }
    Ok(std::fs::read_to_string(dir.join("ca.pem"))?)
}

/// The last lines of a log (for errors).
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    format!(
        "{} ({})",
        lines[lines.len().saturating_sub(10)..].join("\n"),
        path.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_come_from_the_benchmark_range_and_never_collide() {
        assert_eq!(host_address(0), Ipv4Addr::new(198, 18, 1, 1));
        assert_eq!(host_address(MAX_NAMES - 1), Ipv4Addr::new(198, 18, 1, 250));
        let all: std::collections::BTreeSet<Ipv4Addr> = (0..MAX_NAMES)
            .map(host_address)
            .chain([DNS, NODE_END, INTERNET_END])
            .collect();
        assert_eq!(all.len(), MAX_NAMES + 3);
        for ip in &all {
            let [a, b, ..] = ip.octets();
            assert!(a == 198 && (b == 18 || b == 19), "{ip} in {RANGE}");
        }
    }

    #[test]
    fn link_names_carry_the_pid_and_fit_ifnamsiz() {
        let (node, internet) = link_names(4_194_304);
        assert_eq!(node, "fi4194304n");
        assert_eq!(internet, "fi4194304i");
        assert!(node.len() <= 15 && internet.len() <= 15);
    }

    #[test]
    fn names_are_plain_dns_names() {
        for ok in ["allowed.test", "files.allowed.test", "a-1.test", "x"] {
            assert_eq!(invalid_name(ok), None, "{ok}");
        }
        for bad in [
            "",
            "Allowed.test",
            "a..test",
            "-a.test",
            "a b.test",
            "a,b.test",
            "*.test",
            "a.test.",
        ] {
            assert!(invalid_name(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn dnsmasq_answers_exactly_the_hosts_and_nothing_else() {
        let args = dnsmasq_args(&[
            ("allowed.test".into(), Ipv4Addr::new(198, 18, 1, 1)),
            ("files.allowed.test".into(), Ipv4Addr::new(198, 18, 1, 2)),
        ]);
        for flag in [
            "--host-record=allowed.test,198.18.1.1",
            "--host-record=files.allowed.test,198.18.1.2",
            "--listen-address=198.18.0.53",
            "--no-resolv",
            "--no-hosts",
            "--local=/#/",
            "--conf-file=/dev/null",
            "--keep-in-foreground",
        ] {
            assert!(args.iter().any(|a| a == flag), "{flag} in {args:?}");
        }
        assert!(
            !args.iter().any(|a| a.starts_with("--address=")),
            "--address=/name/ would also answer every subdomain"
        );
    }
}
