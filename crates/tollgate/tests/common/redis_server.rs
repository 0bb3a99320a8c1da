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
}

fn redis_server_binary() -> PathBuf {
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

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").port()
}

impl RedisServer {
    /// Starts a server and returns once it accepts connections.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut server = Self {
            child: None,
            port: 0,
            dir,
        };
        // Another process may take the port between our probe and the bind: try again.
        for _ in 0..5 {
            server.port = free_port();
            if server.launch() {
                return server;
            }
        }
        panic!("redis-server did not start on any of 5 ports");
    }

    /// Starts the process on `self.port`; true once it is ready.
    fn launch(&mut self) -> bool {
        let mut child = Command::new(redis_server_binary())
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
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
        let ready = lines
            .by_ref()
            .map_while(Result::ok)
            .any(|line| line.contains("Ready to accept connections"));
        if !ready {
            let _ = child.kill();
            let _ = child.wait();
            return false;
        }
        std::thread::spawn(move || lines.for_each(drop));
        self.child = Some(child);
        true
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
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

    /// Runs `redis-cli` against this server and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let output = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}
