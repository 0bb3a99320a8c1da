//! `tollgate serve` where Envoy Gateway runs its rate limit service: started
//! with the environment the gateway's Deployment sets, its limits over xDS
//! from a controller over mutual TLS, and a real Envoy 1.40 asking it over
//! mutual TLS with the route actions the gateway's translator writes
//! (`examples/envoy-gateway`). The controller here is a Tollgate publishing
//! the translator-shaped files (`serve --publish-xds`).

use tollgate_testkit::certs;
mod common;

use std::collections::HashMap;
use std::time::Duration;

use certs::Authority;
use common::envoy::{examples, Envoy, ONE_AT_A_TIME};

/// The certificates, the controller, the rate limit service and Envoy.
struct Gateway {
    _authority: Authority,
    _controller: common::Serve,
    service: common::Serve,
    envoy: Envoy,
}

/// Everything started and wired as Envoy Gateway wires it.
async fn gateway() -> Gateway {
    let authority = Authority::new();
    let controller_leaf = authority.leaf("controller", &["envoy-gateway"]);
    let service_leaf = authority.leaf("ratelimit", &["envoy-ratelimit"]);
    authority.leaf("envoy", &["envoy"]);
    let path = |path: &std::path::Path| path.display().to_string();
    let ca = path(&authority.ca());

    // The controller: serves the limits over ADS, requiring a client certificate.
    let mut command = common::tollgate(&[
        "serve",
        "--http",
        "127.0.0.1:0",
        "--grpc",
        "127.0.0.1:0",
        "--publish-xds",
    ]);
    command
        .arg("--config")
        .arg(examples().join("envoy-gateway/limits"))
        .env("GRPC_SERVER_USE_TLS", "true")
        .env("GRPC_SERVER_TLS_CERT", path(&controller_leaf.cert))
        .env("GRPC_SERVER_TLS_KEY", path(&controller_leaf.key))
        .env("GRPC_CLIENT_TLS_CACERT", &ca);
    let controller = common::Serve::start_command(command);
    let controller_port = controller.grpc.rsplit_once(':').unwrap().1.to_owned();

    // The rate limit service, with the Deployment's environment.
    let mut command = common::tollgate(&["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"]);
    command.envs(envoy_gateway_environment(
        &format!("localhost:{controller_port}"),
        &path(&service_leaf.cert),
        &path(&service_leaf.key),
        &ca,
    ));
    let service = common::Serve::start_command(command);
    for _ in 0..500 {
        if common::rlconfig_at(&service.http).await.contains("version 1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let rlconfig = common::rlconfig_at(&service.http).await;
    assert!(rlconfig.contains("version 1)"), "{rlconfig}");

    let certs = authority.dir.path().display().to_string();
    let envoy = Envoy::start_with_values("envoy-gateway/envoy.yaml", &service.grpc, &[("CERTS", &certs)]);
    Gateway {
        _authority: authority,
        _controller: controller,
        service,
        envoy,
    }
}

/// What `internal/infrastructure/kubernetes/ratelimit/resource.go` sets
/// (paths and addresses of this machine in place of the Pod's).
fn envoy_gateway_environment(controller: &str, cert: &str, key: &str, ca: &str) -> Vec<(String, String)> {
    [
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("LOG_LEVEL", "info"),
        ("USE_STATSD", "false"),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", controller),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ca),
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", cert),
        ("GRPC_SERVER_TLS_KEY", key),
        ("GRPC_SERVER_TLS_CA_CERT", ca),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value.to_owned()))
    .collect()
}

/// The statuses of `count` requests to `path` with `headers`.
async fn statuses(gateway: &Gateway, path: &str, headers: &[(&str, &str)], count: usize) -> Vec<u16> {
    let client = reqwest::Client::new();
    let mut statuses = Vec::new();
    for _ in 0..count {
        let mut request = client.get(format!("http://{}{path}", gateway.envoy.http));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        statuses.push(request.send().await.expect("envoy answers").status().as_u16());
    }
    statuses
}

fn passed_then_refused(passed: usize, refused: usize) -> Vec<u16> {
    [vec![200; passed], vec![429; refused]].concat()
}

/// Each shape of the translator's output, through Envoy: the limits it
/// says, and Envoy counts no error (no failed call, no TLS failure).
#[tokio::test]
async fn envoy_gateways_rules_hold_through_a_real_envoy_over_mutual_tls() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let gateway = gateway().await;
    let one = [("x-user-id", "one")];
    assert_eq!(statuses(&gateway, "/header", &one, 4).await, passed_then_refused(3, 1));
    assert_eq!(
        statuses(&gateway, "/header", &[("x-user-id", "two")], 5).await,
        [200; 5]
    );
    for user in ["alice", "bob"] {
        let header = [("x-user-id", user)];
        assert_eq!(
            statuses(&gateway, "/distinct", &header, 3).await,
            passed_then_refused(2, 1)
        );
    }
    assert_eq!(statuses(&gateway, "/everyone", &[], 3).await, passed_then_refused(2, 1));
    assert_eq!(statuses(&gateway, "/month", &[], 3).await, passed_then_refused(2, 1));
    assert_eq!(statuses(&gateway, "/year", &[], 2).await, passed_then_refused(1, 1));
    assert_eq!(
        statuses(&gateway, "/shadow", &[], 3).await,
        [200; 3],
        "shadow mode never refuses"
    );
    // One shared policy across two routes.
    let carol = [("x-user-id", "carol")];
    assert_eq!(statuses(&gateway, "/shared-a", &carol, 1).await, [200]);
    assert_eq!(statuses(&gateway, "/shared-b", &carol, 2).await, [200, 429]);
    assert_eq!(statuses(&gateway, "/shared-a", &[("x-user-id", "dan")], 1).await, [200]);

    let stats = gateway.envoy.stats();
    assert_eq!(stats.get("cluster.ratelimit.ssl.handshake"), 1, "{:?}", stats.0);
    assert_eq!(stats.get("cluster.backend.ratelimit.error"), 0, "{:?}", stats.0);
    assert_eq!(
        stats.get("cluster.backend.ratelimit.failure_mode_allowed"),
        0,
        "{:?}",
        stats.0
    );
    assert_eq!(stats.get("cluster.backend.ratelimit.over_limit"), 7, "{:?}", stats.0);

    // Envoy Gateway's conformance suite finds the refusals by this query.
    let metrics = common::metrics_at(&gateway.service.http).await;
    let series: HashMap<&str, f64> = metrics
        .lines()
        .filter(|line| line.starts_with("ratelimit_service_rate_limit_over_limit{"))
        .filter_map(|line| {
            let (labels, value) = line.rsplit_once(' ')?;
            Some((labels, value.parse().ok()?))
        })
        .collect();
    let masked = series
        .iter()
        .find(|(labels, _)| labels.contains("key2=\"masked_remote_address_0_0_0_0/0\""));
    assert!(masked.is_some_and(|(_, value)| *value >= 1.0), "{series:?}");
    assert!(
        metrics.contains("ratelimit_service_rate_limit_shadow_mode{"),
        "{metrics}"
    );
}
