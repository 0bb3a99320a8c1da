//! Envoy Gateway's translator output, as its controller serves it: each
//! `RateLimitConfig` (in the shape the translator writes, every field,
//! defaults included) served over xDS gives the very `/rlconfig` the same
//! file loaded as YAML gives; and a Tollgate publishing its files over xDS
//! configures another one to the same rules.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tollgate::{AnyStore, MemoryStore};
use tollgate_server::xds::{XdsSettings, XdsStatus};
use tollgate_server::{Config, Options, Server};

use common::control_plane::{resource_from_yaml, ControlPlane, Snapshot};

/// The translator-shaped files: the example's and the tests' own.
fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in [
        root.join("../../examples/envoy-gateway/limits"),
        root.join("tests/fixtures/envoy-gateway"),
    ] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            files.push(entry.unwrap().path());
        }
    }
    files.sort();
    assert!(files.len() >= 4, "{files:?}");
    files
}

use common::{on_port_0 as run, OnPort0 as Running};

fn memory() -> AnyStore {
    AnyStore::Memory(MemoryStore::new())
}

/// `/rlconfig` without its first line (which says where the rules came from).
async fn rules(running: &Running) -> String {
    let text = running.text("/rlconfig").await;
    let (source, rules) = text.split_once('\n').unwrap();
    assert!(source.starts_with("# config: "), "{text}");
    rules.to_owned()
}

fn xds(server: String) -> XdsSettings {
    XdsSettings {
        server,
        connect_retry: Duration::from_millis(50),
        backoff_initial: Duration::from_millis(50),
        ..XdsSettings::default()
    }
}

async fn wait_for(status: &mut watch::Receiver<XdsStatus>, version: &str) {
    let waited = tokio::time::timeout(
        Duration::from_secs(10),
        status.wait_for(|status| status.version.as_deref() == Some(version)),
    )
    .await;
    assert!(waited.is_ok(), "version {version} never applied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_fixture_over_xds_reads_as_the_same_file() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let plane = ControlPlane::start(listener, Snapshot::default(), None);
    let server =
        Server::new(Config::default(), None, memory(), Options::default()).xds(xds(plane.address.to_string()), false);
    let mut status = server.xds_status().unwrap();
    let over_xds = run(server).await;
    for (version, file) in (1..).zip(fixtures()) {
        let text = std::fs::read_to_string(&file).unwrap();
        let version = version.to_string();
        plane.serve(Snapshot::of(&version, &[resource_from_yaml(&text)]));
        wait_for(&mut status, &version).await;
        let from_file = run(Server::new(
            Config::load(&file).unwrap(),
            Some(file.clone()),
            memory(),
            Options::default(),
        ))
        .await;
        let (xds_rules, file_rules) = (rules(&over_xds).await, rules(&from_file).await);
        assert!(!file_rules.is_empty(), "{}", file.display());
        assert_eq!(xds_rules, file_rules, "{}", file.display());
    }
    plane.stop().await;
}

/// `serve --publish-xds` as the controller of another `serve`: the same
/// rules on both, and a reload of the files reaches the other at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publishing_server_configures_another() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/envoy-gateway/limits");
    for entry in std::fs::read_dir(&limits).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    let config = Config::load(dir.path()).unwrap();
    let controller = Server::new(config, Some(dir.path().to_owned()), memory(), Options::default()).publish_xds();
    let mut reloads = controller.reloads();
    let controller = run(controller).await;
    let service =
        Server::new(Config::default(), None, memory(), Options::default()).xds(xds(controller.grpc.to_string()), true);
    let mut status = service.xds_status().unwrap();
    let service = run(service).await;
    wait_for(&mut status, "1").await;
    assert_eq!(rules(&service).await, rules(&controller).await);

    let first = dir.path().join("first-listener.yaml");
    let edited = std::fs::read_to_string(&first)
        .unwrap()
        .replace("requests_per_unit: 3", "requests_per_unit: 30");
    std::fs::write(&first, edited).unwrap();
    reloads
        .wait_for(|reload| *reload != tollgate_server::Reload::Initial)
        .await
        .unwrap();
    wait_for(&mut status, "2").await;
    let rules = rules(&service).await;
    assert!(
        rules.contains(
            "first-listener.first-route_first-route.rule-0-match-0_rule-0-match-0: unit=HOUR requests_per_unit=30"
        ),
        "{rules}"
    );
}
