//! Test harness: starts the real `orchard-agent` binary on 127.0.0.1 (port 0) with a token and a
//! private root directory, and talks to it over HTTP with a keep-alive client.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type RequestBody = BoxBody<Bytes, BoxError>;

pub const TOKEN: &str = "test-token-0123456789";

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "orchard-agent-test-{name}-{}-{}",
            std::process::id(),
            unique()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(std::fs::canonicalize(dir).unwrap())
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

pub fn agent_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_orchard-agent"))
}

/// A running agent process.
pub struct Agent {
    child: Child,
    pub addr: SocketAddr,
    pub root: TempDir,
    pub token_file: PathBuf,
    client: Client<HttpConnector, RequestBody>,
    pub logs: Arc<Mutex<Vec<String>>>,
}

pub struct AgentOptions {
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Pass `--token-file` (the harness' token). Without it, without an `ORCHARD_AGENT_TOKEN*`
    /// variable in `env` and without a `--token*` flag in `args`, the agent is started with
    /// `--insecure-no-auth`.
    pub with_token: bool,
    /// Run the agent as this uid and gid (supplementary groups dropped) instead of the test's.
    pub uid: Option<u32>,
    /// Command line put before the agent (e.g. `chroot DIR`, `unshare ...`).
    pub wrapper: Vec<String>,
    /// Agent executable as the wrapper sees it (default: the test build).
    pub binary: Option<PathBuf>,
    /// `--root` value (default: a fresh temp dir).
    pub root: Option<String>,
}

impl Default for AgentOptions {
    fn default() -> Self {
        AgentOptions {
            args: Vec::new(),
            env: Vec::new(),
            with_token: true,
            uid: None,
            wrapper: Vec::new(),
            binary: None,
            root: None,
        }
    }
}

impl Agent {
    pub fn start() -> Agent {
        Agent::start_with(AgentOptions::default())
    }

    pub fn start_with(options: AgentOptions) -> Agent {
        let root = TempDir::new("root");
        let secrets = root.path().join("secrets");
        std::fs::create_dir_all(&secrets).unwrap();
        let token_file = secrets.join("token");
        std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
        let binary = options.binary.clone().unwrap_or_else(agent_binary);
        let mut command = match options.wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(&binary);
                command
            }
            None => Command::new(&binary),
        };
        let root_arg = options
            .root
            .clone()
            .unwrap_or_else(|| root.path().display().to_string());
        command
            .arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--root")
            .arg(root_arg);
        if options.with_token {
            command.arg("--token-file").arg(&token_file);
        } else if !options
            .env
            .iter()
            .any(|(key, _)| key.starts_with("ORCHARD_AGENT_TOKEN"))
            && !options.args.iter().any(|arg| arg.starts_with("--token"))
        {
            command.arg("--insecure-no-auth");
        }
        if let Some(uid) = options.uid {
            use std::os::unix::process::CommandExt;
            command.uid(uid).gid(uid);
        }
        command.args(&options.args);
        for (key, value) in &options.env {
            command.env(key, value);
        }
        command
            .env("ORCHARD_AGENT_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("start orchard-agent");
        let stderr = child.stderr.take().unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (address_sender, address_receiver) = std::sync::mpsc::channel();
        let log_sink = Arc::clone(&logs);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(address) = orchard_bench_support::listen_address_in(&line) {
                    let _ = address_sender.send(address.to_string());
                }
                log_sink.lock().unwrap().push(line);
            }
        });
        let address = address_receiver
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| {
                panic!(
                    "agent did not report its address; logs: {:?}",
                    logs.lock().unwrap()
                )
            });
        let addr: SocketAddr = address.parse().unwrap();
        let client = Client::builder(TokioExecutor::new()).build_http();
        Agent {
            child,
            addr,
            root,
            token_file,
            client,
            logs,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Peak resident memory of the agent process (VmHWM), in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        proc_status_kib(self.pid(), "VmHWM:")
    }

    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: RequestBody,
        token: Option<&str>,
    ) -> hyper::Response<hyper::body::Incoming> {
        let mut builder = Request::builder().method(method).uri(self.url(path));
        if let Some(token) = token {
            builder = builder.header("Authorization", format!("Bearer {token}"));
        }
        let request = builder.body(body).unwrap();
        self.client
            .request(request)
            .await
            .expect("request to the agent")
    }

    /// Sends with the right token; returns status and the whole body.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: impl Into<Bytes>,
    ) -> (StatusCode, Bytes) {
        let response = self.send(method, path, full(body), Some(TOKEN)).await;
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, bytes)
    }

    pub async fn json(&self, method: Method, path: &str, body: Value) -> (StatusCode, Value) {
        let payload = if body.is_null() {
            Bytes::new()
        } else {
            Bytes::from(body.to_string())
        };
        let (status, bytes) = self.call(method, path, payload).await;
        let value = serde_json::from_slice(&bytes).unwrap_or_else(|error| {
            panic!(
                "response of {path} is not JSON ({error}): {}",
                String::from_utf8_lossy(&bytes)
            )
        });
        (status, value)
    }

    pub async fn exec(&self, body: Value) -> Value {
        let (status, value) = self.json(Method::POST, "/v1/exec", body).await;
        assert_eq!(status, StatusCode::OK, "{value}");
        value
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.json(Method::GET, path, Value::Null).await
    }
}

impl Drop for Agent {
    /// SIGTERM first, so the agent's shutdown kills the commands it started; SIGKILL if it hangs.
    fn drop(&mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn full(body: impl Into<Bytes>) -> RequestBody {
    Full::new(body.into())
        .map_err(|never| match never {})
        .boxed()
}

pub fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|line| line.starts_with(field))
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|kib| kib.parse().ok())
        .unwrap_or(0)
}

/// Whether `pid` is alive (a zombie waiting for its reaper counts as dead).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().next())
                .unwrap_or("X");
            state != "Z" && state != "X"
        }
        Err(_) => false,
    }
}

/// Waits up to `timeout` for every pid to die; returns the survivors.
pub async fn wait_dead(pids: &[u32], timeout: Duration) -> Vec<u32> {
    let deadline = Instant::now() + timeout;
    loop {
        let survivors: Vec<u32> = pids.iter().copied().filter(|pid| alive(*pid)).collect();
        if survivors.is_empty() || Instant::now() > deadline {
            return survivors;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn pids_in(text: &str) -> Vec<u32> {
    text.split_whitespace()
        .filter_map(|word| word.parse().ok())
        .collect()
}

/// Kills stray test processes by pid (never by name).
pub fn kill_pids(pids: &[u32]) {
    for pid in pids {
        unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
    }
}

/// The race of the files API's protections: keeps exchanging `<dir>/d` between a real directory
/// holding a decoy `token` file and a symlink `d -> <link_target>` (the token's directory), in a tight
/// loop on a thread of its own, until [`DirectorySwapper::stop`]. The exchange is atomic
/// (`renameat2(RENAME_EXCHANGE)`), so `d` always exists; the decoy is put back whenever a request
/// deleted it.
pub struct DirectorySwapper {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl DirectorySwapper {
    /// Starts swapping `dir/d` with `dir/d-swap`; returns once the loop runs.
    pub fn start(dir: &Path, link_target: &str, decoy: &'static [u8]) -> DirectorySwapper {
        use std::sync::atomic::{AtomicBool, Ordering};
        let real = dir.join("d");
        let other = dir.join("d-swap");
        std::fs::create_dir(&real).unwrap();
        std::fs::write(real.join("token"), decoy).unwrap();
        std::os::unix::fs::symlink(link_target, &other).unwrap();
        let c_path =
            |path: &Path| std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        let (real_c, other_c) = (c_path(&real), c_path(&other));
        let stop = Arc::new(AtomicBool::new(false));
        let running = Arc::new(std::sync::Barrier::new(2));
        let thread = {
            let (stop, running) = (Arc::clone(&stop), Arc::clone(&running));
            std::thread::spawn(move || {
                running.wait();
                let mut swaps = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: two valid NUL-terminated paths.
                    let exchanged = unsafe {
                        libc::renameat2(
                            libc::AT_FDCWD,
                            real_c.as_ptr(),
                            libc::AT_FDCWD,
                            other_c.as_ptr(),
                            libc::RENAME_EXCHANGE,
                        )
                    };
                    assert_eq!(exchanged, 0, "{}", std::io::Error::last_os_error());
                    swaps += 1;
                    // The real directory is at `d` after an even number of exchanges.
                    let directory = if swaps.is_multiple_of(2) {
                        &real
                    } else {
                        &other
                    };
                    let _ = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(directory.join("token"))
                        .and_then(|mut file| std::io::Write::write_all(&mut file, decoy));
                }
                swaps
            })
        };
        running.wait();
        DirectorySwapper {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the loop; returns how many exchanges it made.
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread
            .take()
            .map(|thread| thread.join().expect("the swapper thread panicked"))
            .unwrap_or(0)
    }
}

impl Drop for DirectorySwapper {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Sends `count` requests made by `request` (given the request's index), `parallel` at a time, and
/// returns every status and body in index order.
pub async fn send_many(
    agent: &Agent,
    count: usize,
    parallel: usize,
    request: impl Fn(usize) -> (Method, String, Bytes),
) -> Vec<(StatusCode, Bytes)> {
    use futures::StreamExt;
    futures::stream::iter((0..count).map(|index| {
        let (method, path, body) = request(index);
        async move { agent.call(method, &path, body).await }
    }))
    .buffered(parallel)
    .collect()
    .await
}

/// A connection of its own to `addr`, for requests that must travel on it.
pub async fn http_connection(
    addr: SocketAddr,
) -> hyper::client::conn::http1::SendRequest<RequestBody> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|error| panic!("connect to the agent at {addr}: {error}"));
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("HTTP/1.1 handshake");
    tokio::spawn(connection);
    sender
}

/// `GET /healthz` on `sender`'s connection; the status.
pub async fn healthz_on(
    sender: &mut hyper::client::conn::http1::SendRequest<RequestBody>,
) -> StatusCode {
    let request = Request::get("/healthz")
        .header("Host", "agent")
        .body(full(""))
        .unwrap();
    let response = sender.send_request(request).await.expect("an answer");
    let status = response.status();
    response.into_body().collect().await.expect("the body");
    status
}
