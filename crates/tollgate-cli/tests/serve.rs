//! `tollgate serve` as a process: config checks, a request, a graceful stop.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

fn tollgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
}

fn examples() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/config")
}

#[test]
fn check_config_accepts_the_bundled_example() {
    let output = tollgate()
        .args(["serve", "--check-config", "--config"])
        .arg(examples())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "ok: 1 domain(s): example\n");
}

#[test]
fn check_config_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.yaml");
    std::fs::write(
        &file,
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
    )
    .unwrap();
    let output = tollgate()
        .args(["serve", "--check-config", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("bad.yaml:5: "), "{stderr}");
    assert!(stderr.contains("unknown unit \"fortnight\""), "{stderr}");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn serves_and_stops_gracefully_on_sigterm() {
    let (http, grpc) = (free_port(), free_port());
    let mut child = tollgate()
        .args([
            "serve",
            "--http",
            &format!("127.0.0.1:{http}"),
            "--grpc",
            &format!("127.0.0.1:{grpc}"),
            "--config",
        ])
        .arg(examples())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut logs = BufReader::new(child.stderr.take().unwrap()).lines();
    // Ready once it says so: no polling.
    let ready = logs
        .by_ref()
        .map_while(Result::ok)
        .any(|line| line.contains("tollgate serve is ready"));
    assert!(ready, "the server never said it was ready");

    let body = r#"{"domain":"example","descriptors":[{"entries":[{"key":"remote_address","value":"198.51.100.1"}]}]}"#;
    let client = reqwest::Client::new();
    for expected in [200, 200, 200, 200, 200, 429] {
        let response = client
            .post(format!("http://127.0.0.1:{http}/v1/check"))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), expected);
    }

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = child.wait().unwrap();
    assert!(exit.success(), "{exit:?}");
    let rest: Vec<String> = logs.map_while(Result::ok).collect();
    assert!(rest.iter().any(|line| line.contains("stopped")), "{rest:?}");
}
