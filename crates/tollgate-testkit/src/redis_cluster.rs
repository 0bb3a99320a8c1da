//! Real Redis topologies for the Cluster and Sentinel tests: a Cluster of 3
//! masters and 3 replicas, and a master with a replica watched by 3
//! Sentinels. Every process runs on a free 127.0.0.1 port in its own
//! temporary directory, and is stopped by its pid when dropped.
//!
//! Waiting for a topology to settle (a cluster to agree, a replica to sync,
//! a failover to finish) polls the processes' own reports — `CLUSTER INFO`,
//! `ROLE`, `SENTINEL MASTER` — until they say so.

use std::process::Command;
use std::time::{Duration, Instant};

use super::redis_server::{free_port, RedisServer, TestCa};

/// How long a Cluster node or a Sentinel takes to declare a peer down.
pub const NODE_TIMEOUT_MS: u64 = 1_000;

/// Polls `done` until it holds; panics with `what` if it has not after a
/// minute (a broken topology, not a slow one).
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "gave up waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `redis-cli --cluster <args>` (over TLS when `tls`); panics when it fails.
fn cluster_cli(tls: bool, args: &[&str]) -> String {
    let output = Command::new("redis-cli")
        .args(if tls { &["--tls", "--insecure"][..] } else { &[] })
        .arg("--cluster")
        .args(args)
        .output()
        .expect("run redis-cli --cluster");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success() && !text.contains("[ERR]"),
        "redis-cli --cluster {args:?} failed: {text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    text
}

/// A Redis Cluster: 3 masters and 3 replicas.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// The certificates of a TLS Cluster (read again if a node restarts).
    ca: Option<TestCa>,
}

impl RedisCluster {
    /// Starts 6 nodes, joins them with `redis-cli --cluster create
    /// --cluster-replicas 1`, and returns once every node reports
    /// `cluster_state:ok` and every replica is in sync.
    pub fn start() -> Self {
        Self::start_full(None, |_| Vec::new())
    }

    /// 3 masters and no replica (a `WAIT` on them lasts its whole timeout).
    pub fn start_masters() -> Self {
        Self::start_nodes(None, 0, |_| Vec::new())
    }

    /// The same, giving node `index` the extra arguments `node_args(index)`
    /// (a module on some nodes only, say). `redis-cli --cluster create`
    /// makes the first three nodes masters (all run on one host, so it
    /// takes them in the order given), and the last three their replicas.
    pub fn start_with(node_args: impl Fn(usize) -> Vec<String>) -> Self {
        Self::start_full(None, node_args)
    }

    /// The same, speaking only TLS (clients, replication and the cluster
    /// bus) with a certificate of a fresh CA; returns the CA (PEM) too.
    pub fn start_tls() -> (Self, Vec<u8>) {
        let ca = TestCa::new();
        let pem = ca.pem();
        (Self::start_full(Some(ca), |_| Vec::new()), pem)
    }

    fn start_full(ca: Option<TestCa>, node_args: impl Fn(usize) -> Vec<String>) -> Self {
        Self::start_nodes(ca, 1, node_args)
    }

    /// 3 masters with `replicas` replicas each.
    fn start_nodes(ca: Option<TestCa>, replicas: usize, node_args: impl Fn(usize) -> Vec<String>) -> Self {
        let tls_args: Vec<String> = ca.as_ref().map_or_else(Vec::new, |ca| {
            let mut args = ca.server_args();
            args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"].map(String::from));
            args
        });
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|index| {
                let mut args: Vec<String> = vec![
                    "--cluster-enabled".into(),
                    "yes".into(),
                    "--cluster-config-file".into(),
                    "nodes.conf".into(),
                    "--cluster-node-timeout".into(),
                    NODE_TIMEOUT_MS.to_string(),
                    // The bus port, chosen here: port + 10 000 may be taken or out of range.
                    "--cluster-port".into(),
                    free_port().to_string(),
                ];
                args.extend(tls_args.iter().cloned());
                args.extend(node_args(index));
                RedisServer::start_with(&args)
            })
            .collect();
        let addresses: Vec<String> = nodes.iter().map(|node| format!("127.0.0.1:{}", node.port())).collect();
        let mut args = vec!["create"];
        args.extend(addresses.iter().map(String::as_str));
        let replicas = replicas.to_string();
        args.extend(["--cluster-replicas", &replicas, "--cluster-yes"]);
        cluster_cli(ca.is_some(), &args);
        let cluster = Self { nodes, ca };
        cluster.wait_until_ok();
        cluster
    }

    /// `redis+cluster://` with every node as a seed.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port()))
            .collect();
        let scheme = if self.ca.is_some() { "rediss" } else { "redis" };
        format!("{scheme}+cluster://{}", seeds.join(","))
    }

    /// The nodes, masters and replicas alike.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Node `index`.
    pub fn node(&self, index: usize) -> &RedisServer {
        &self.nodes[index]
    }

    /// Node `index`, to stop or restart.
    pub fn node_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    /// Waits until every running node reports `cluster_state:ok`, every
    /// running replica's link to its master is up, and all agree on who is
    /// master.
    pub fn wait_until_ok(&self) {
        wait_until("cluster_state:ok on every node", || {
            self.running()
                .all(|index| self.nodes[index].cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
        });
        wait_until("every replica in sync", || {
            self.running().all(|index| {
                let info = self.nodes[index].cli(&["INFO", "replication"]);
                info.contains("role:master") || info.contains("master_link_status:up")
            })
        });
    }

    fn running(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&index| self.nodes[index].is_running())
    }

    /// The node's cluster id.
    pub fn id(&self, index: usize) -> String {
        self.nodes[index].cli(&["CLUSTER", "MYID"])
    }

    /// Whether node `index` is a master now.
    pub fn is_master(&self, index: usize) -> bool {
        self.nodes[index].cli(&["ROLE"]).lines().next() == Some("master")
    }

    /// The running masters, by index.
    pub fn masters(&self) -> Vec<usize> {
        self.running().filter(|&index| self.is_master(index)).collect()
    }

    /// The replica of master `index`.
    pub fn replica_of(&self, master: usize) -> usize {
        let id = self.id(master);
        self.running()
            .find(|&index| {
                index != master
                    && self.nodes[index]
                        .cli(&["INFO", "replication"])
                        .contains(&format!("master_port:{}", self.nodes[master].port()))
            })
            .unwrap_or_else(|| panic!("master {id} has no replica"))
    }

    /// Moves `slots` hash slots from master `from` to master `to` with
    /// `redis-cli --cluster reshard`, keys and all; returns its output.
    pub fn reshard(&self, from: usize, to: usize, slots: u32) -> String {
        let entry = format!("127.0.0.1:{}", self.nodes[to].port());
        let (from, to, slots) = (self.id(from), self.id(to), slots.to_string());
        cluster_cli(
            self.ca.is_some(),
            &[
                "reshard",
                &entry,
                "--cluster-from",
                &from,
                "--cluster-to",
                &to,
                "--cluster-slots",
                &slots,
                "--cluster-yes",
                "--cluster-pipeline",
                "10",
            ],
        )
    }

    /// How many keys each running master holds.
    pub fn keys_per_master(&self) -> Vec<u64> {
        self.masters()
            .into_iter()
            .map(|index| self.nodes[index].cli(&["DBSIZE"]).parse().unwrap_or(0))
            .collect()
    }
}

/// A master and its replica, watched by 3 Sentinels (quorum 2).
pub struct SentinelSet {
    /// The master at start.
    pub master: RedisServer,
    /// Its replica, promoted when the master fails.
    pub replica: RedisServer,
    /// The Sentinels.
    pub sentinels: Vec<RedisServer>,
    name: String,
}

impl SentinelSet {
    /// Starts the set and returns once the replica is in sync and every
    /// Sentinel knows the replica and the other two Sentinels.
    pub fn start(name: &str) -> Self {
        Self::start_fronted(name, &[], |port| port)
    }

    /// The same, the master started with `master_args`, and the replica and
    /// the Sentinels reaching it at the port `front` returns for the
    /// master's own (a proxy's in front of it, say): then the Sentinels
    /// name that port as the master's until a failover.
    pub fn start_fronted(name: &str, master_args: &[String], front: impl FnOnce(u16) -> u16) -> Self {
        let master = RedisServer::start_with(master_args);
        let master_port = front(master.port());
        let replica = RedisServer::start_with(&["--replicaof".into(), "127.0.0.1".into(), master_port.to_string()]);
        wait_until("the replica in sync", || {
            replica.cli(&["INFO", "replication"]).contains("master_link_status:up")
        });
        let sentinels: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::start_sentinel(name, master_port, 2, NODE_TIMEOUT_MS))
            .collect();
        let set = Self {
            master,
            replica,
            sentinels,
            name: name.to_owned(),
        };
        wait_until("every Sentinel to know the replica and its peers", || {
            set.sentinels.iter().all(|sentinel| {
                let report = sentinel.cli(&["SENTINEL", "MASTER", &set.name]);
                field(&report, "num-slaves") == Some("1") && field(&report, "num-other-sentinels") == Some("2")
            })
        });
        set
    }

    /// `redis+sentinel://<the three Sentinels>/<name>`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|sentinel| format!("127.0.0.1:{}", sentinel.port()))
            .collect();
        format!("redis+sentinel://{}/{}", hosts.join(","), self.name)
    }

    /// The port of the master the first Sentinel names now.
    pub fn master_port(&self) -> Option<u16> {
        self.master_port_by(0)
    }

    /// The port of the master Sentinel `index` names now.
    pub fn master_port_by(&self, index: usize) -> Option<u16> {
        let answer = self.sentinels[index].cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &self.name]);
        answer.lines().nth(1).and_then(|port| port.trim().parse().ok())
    }
}

/// The value after `name` in a `redis-cli` report of alternating lines.
fn field<'a>(report: &'a str, name: &str) -> Option<&'a str> {
    let mut lines = report.lines();
    while let Some(line) = lines.next() {
        if line.trim() == name {
            return lines.next().map(str::trim);
        }
    }
    None
}
