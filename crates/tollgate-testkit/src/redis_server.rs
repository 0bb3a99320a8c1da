//! A real `redis-server` per test: temporary directory, free port on
//! 127.0.0.1, no persistence; stopped (by its pid) when dropped.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// A `redis-server` process this test started.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
    /// Text in `redis.conf` in its directory, read at start (Sentinels
    /// need a configuration file they can rewrite).
    config: Option<String>,
    /// Runs as a Sentinel.
    sentinel: bool,
}

/// The server binary: `TOLLGATE_REDIS_SERVER` when set (to run the suite
/// against another version, or Valkey), else `redis-server` from `PATH`.
fn redis_server_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("TOLLGATE_REDIS_SERVER") {
        return PathBuf::from(path);
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("redis-server"))
            .find(|path| path.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "redis-server is not installed; the Redis tests need it. Run scripts/test (it installs it \
             as root), or install it yourself: `apt-get install -y redis-server` on Debian"
        )
    })
}

/// Tollgate's Redis module (`libtollgate_redis_module.so`):
/// `TOLLGATE_REDIS_MODULE` when set (scripts/test builds it and sets it),
/// else built here once, into the workspace's `target/tmp/module-build`
/// (the outer `cargo test` holds `target` itself), which needs libclang
/// (Debian: `apt-get install -y libclang-dev`).
pub fn module_path() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            if let Some(path) = std::env::var_os("TOLLGATE_REDIS_MODULE") {
                return PathBuf::from(path);
            }
            // The workspace's target directory, beside the one the outer
            // `cargo test` holds.
            let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/tmp/module-build");
            let status = Command::new(option_env!("CARGO").unwrap_or("cargo"))
                .args(["build", "--locked", "-p", "tollgate-redis-module", "--target-dir"])
                .arg(&target)
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .expect("run cargo build for the Redis module");
            assert!(
                status.success(),
                "building the Redis module failed (it needs libclang: `apt-get install -y libclang-dev` \
                 on Debian; scripts/test installs it); or set TOLLGATE_REDIS_MODULE to a built .so"
            );
            target.join("debug").join("libtollgate_redis_module.so")
        })
        .clone()
}

/// True when every server a test starts loads the module
/// (`TOLLGATE_LOAD_MODULE=1`: scripts/test's second run of the suites).
pub fn module_everywhere() -> bool {
    std::env::var_os("TOLLGATE_LOAD_MODULE").is_some_and(|value| value == "1")
}

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").port()
}

impl RedisServer {
    /// Starts a server and returns once it accepts connections.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra arguments; with TLS files among them it
    /// listens with TLS only (see [`RedisServer::start_tls`]).
    pub fn start_with(extra: &[String]) -> Self {
        Self::start_full(extra, None, false)
    }

    /// Starts a server with Tollgate's module loaded.
    pub fn start_with_module(extra: &[String]) -> Self {
        let mut args = vec!["--loadmodule".to_owned(), module_path().display().to_string()];
        args.extend_from_slice(extra);
        Self::start_full(&args, None, false)
    }

    /// Starts a Sentinel watching the master `name` at `master_port` on
    /// 127.0.0.1, with `quorum`, declaring it down after `down_after_ms`.
    pub fn start_sentinel(name: &str, master_port: u16, quorum: u32, down_after_ms: u64) -> Self {
        let config = format!(
            "sentinel monitor {name} 127.0.0.1 {master_port} {quorum}\n\
             sentinel down-after-milliseconds {name} {down_after_ms}\n\
             sentinel failover-timeout {name} 10000\n\
             sentinel parallel-syncs {name} 1\n"
        );
        Self::start_full(&[], Some(config), true)
    }

    fn start_full(extra: &[String], config: Option<String>, sentinel: bool) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut server = Self {
            child: None,
            port: 0,
            dir,
            extra: extra.to_vec(),
            config,
            sentinel,
        };
        // Another process may take the port between our probe and the bind: try again.
        for attempt in 0..5 {
            server.port = free_port();
            if attempt > 0 {
                // A Cluster bus port given among the arguments may be the one taken.
                if let Some(at) = server.extra.iter().position(|arg| arg == "--cluster-port") {
                    if let Some(bus) = server.extra.get_mut(at + 1) {
                        *bus = free_port().to_string();
                    }
                }
            }
            if server.launch() {
                return server;
            }
        }
        panic!("redis-server did not start on any of 5 ports");
    }

    /// Starts the process on `self.port`; true once it is ready.
    fn launch(&mut self) -> bool {
        let tls = self.extra.iter().any(|arg| arg == "--tls-cert-file");
        let (plain, tls_port) = if tls { (0, self.port) } else { (self.port, 0) };
        let mut command = Command::new(redis_server_binary());
        if let Some(config) = &self.config {
            let path = self.dir.path().join("redis.conf");
            // A Sentinel rewrites its file: write it only the first time.
            if !path.exists() {
                std::fs::write(&path, config).expect("write redis.conf");
            }
            command.arg(path);
        }
        if self.sentinel {
            command.arg("--sentinel");
        } else if module_everywhere() && !self.extra.iter().any(|arg| arg == "--loadmodule") {
            command.arg("--loadmodule").arg(module_path());
        }
        let mut child = command
            .args(if tls {
                vec!["--tls-port".to_owned(), tls_port.to_string()]
            } else {
                Vec::new()
            })
            .args([
                "--port",
                &plain.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            // After the defaults, so that a test may ask for persistence.
            .args(&self.extra)
            .args(["--dir".as_ref(), self.dir.path().as_os_str()])
            .args(["--logfile", "", "--daemonize", "no", "--protected-mode", "yes"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        // Readiness is announced on the log: no polling, no sleeping.
        let announce = if self.sentinel {
            "+monitor master"
        } else {
            "Ready to accept connections"
        };
        let mut seen = Vec::new();
        let ready = lines.by_ref().map_while(Result::ok).any(|line| {
            let ready = line.contains(announce);
            seen.push(line);
            ready
        });
        if !ready {
            let _ = child.kill();
            let _ = child.wait();
            let tail = seen.len().saturating_sub(5);
            eprintln!(
                "redis-server on port {} did not start: {}",
                self.port,
                seen[tail..].join(" | ")
            );
            return false;
        }
        std::thread::spawn(move || lines.for_each(drop));
        self.child = Some(child);
        true
    }

    /// A server that speaks only TLS, with a certificate for 127.0.0.1 signed
    /// by a fresh CA; returns the server and the CA certificate (PEM).
    pub fn start_tls() -> (Self, Vec<u8>) {
        let ca = TestCa::new();
        let server = Self::start_with(&ca.server_args());
        let pem = ca.pem();
        // The server read its files at start; the directory may go.
        drop(ca);
        (server, pem)
    }

    /// A server that speaks only TLS and requires a client certificate
    /// signed by its CA (`tls-auth-clients yes`); returns the server, the CA
    /// certificate, and a client certificate and its key (PEM).
    pub fn start_mutual_tls() -> (Self, Vec<u8>, Vec<u8>, Vec<u8>) {
        let ca = TestCa::new();
        let mut args = ca.server_args();
        if let Some(auth) = args.last_mut() {
            "yes".clone_into(auth);
        }
        let server = Self::start_with(&args);
        // The server's certificate, signed by the CA, serves as a client's.
        let read = |name: &str| std::fs::read(ca.path(name)).expect("read a certificate file");
        let (cert, key) = (read("server.pem"), read("server.key"));
        (server, ca.pem(), cert, key)
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// True while its process runs.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Stops the process (by its pid) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the process again on the same port (after [`RedisServer::stop`]).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop before restart");
        assert!(self.launch(), "redis-server did not restart on port {}", self.port);
    }

    /// A replica of this server, once its link is up and this server counts
    /// it for `WAIT` (polled, with a deadline of 10 s).
    pub fn start_replica(&self) -> Self {
        let port = self.port.to_string();
        let replica = Self::start_with(&["--replicaof".to_owned(), "127.0.0.1".to_owned(), port]);
        let started = std::time::Instant::now();
        let deadline = std::time::Duration::from_secs(10);
        while !replica.cli(&["INFO", "replication"]).contains("master_link_status:up") {
            assert!(started.elapsed() < deadline, "the replica never synced");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // Synced is not yet acknowledging: the master counts a replica for
        // WAIT once it has reported its offset.
        while !self.acknowledged_by_a_replica() {
            assert!(started.elapsed() < deadline, "the replica never acknowledged");
        }
        replica
    }

    /// A write and a `WAIT 1 100` on one connection count one replica.
    fn acknowledged_by_a_replica(&self) -> bool {
        let mut child = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("run redis-cli");
        std::io::Write::write_all(
            child.stdin.as_mut().expect("stdin"),
            b"SET replica-probe 1\nWAIT 1 100\n",
        )
        .expect("write");
        let output = child.wait_with_output().expect("redis-cli ends");
        String::from_utf8_lossy(&output.stdout).lines().last() == Some("1")
    }

    /// Runs `redis-cli` against this server and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let tls = self.extra.iter().any(|arg| arg == "--tls-cert-file");
        let output = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(if tls { &["--tls", "--insecure"][..] } else { &[] })
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }
}

/// A fresh CA and a certificate for 127.0.0.1 it signed, in a temporary
/// directory (kept while this lives).
pub struct TestCa {
    dir: tempfile::TempDir,
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

impl TestCa {
    /// Makes the CA, the server key and its certificate with `openssl`.
    pub fn new() -> Self {
        let certs = tempfile::tempdir().expect("temporary directory");
        let path = |name: &str| certs.path().join(name).to_string_lossy().into_owned();
        let openssl = |args: &[&str]| {
            let status = Command::new("openssl")
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("run openssl");
            assert!(status.success(), "openssl {args:?} failed");
        };
        let (ca_key, ca, key, csr, cert) = (
            path("ca.key"),
            path("ca.pem"),
            path("server.key"),
            path("server.csr"),
            path("server.pem"),
        );
        let new_key = ["-newkey", "rsa:2048", "-nodes"];
        let ca_args = [
            "-days",
            "1",
            "-subj",
            "/CN=tollgate test CA",
            "-keyout",
            &ca_key,
            "-out",
            &ca,
        ];
        openssl(&[&["req", "-x509"][..], &new_key, &ca_args].concat());
        openssl(
            &[
                &["req"][..],
                &new_key,
                &["-subj", "/CN=127.0.0.1", "-keyout", &key, "-out", &csr],
            ]
            .concat(),
        );
        let extensions = path("san.ext");
        std::fs::write(&extensions, "subjectAltName=IP:127.0.0.1\n").expect("write extensions");
        openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            &extensions,
            "-out",
            &cert,
        ]);
        Self { dir: certs }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_string_lossy().into_owned()
    }

    /// The arguments that make a `redis-server` speak TLS with these files.
    pub fn server_args(&self) -> Vec<String> {
        vec![
            "--tls-cert-file".to_owned(),
            self.path("server.pem"),
            "--tls-key-file".to_owned(),
            self.path("server.key"),
            "--tls-ca-cert-file".to_owned(),
            self.path("ca.pem"),
            "--tls-auth-clients".to_owned(),
            "no".to_owned(),
        ]
    }

    /// The CA certificate (PEM).
    pub fn pem(&self) -> Vec<u8> {
        std::fs::read(self.path("ca.pem")).expect("read the CA certificate")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}
