//! Seeing usage through the command: `tollgate usage` against a running
//! `tollgate serve` (a read-only token), and which rule refused a request
//! (a response header, a sampled log line).

mod common;

/// Windows of a day: none ends while a test runs.
const CONFIG: &str = "
domain: api
descriptors:
  - key: tenant
    rate_limit: {name: per-tenant, unit: day, requests_per_unit: 2}
    descriptors:
      - key: path
        value: /search
        rate_limit: {unit: hour, requests_per_unit: 50}
      - key: path
        rate_limit: {unit: hour, requests_per_unit: 500}
";

fn json_request(http: &str, tenant: &str) -> (u16, serde_json::Value) {
    let body = serde_json::json!({"domain": "api", "descriptors": [{"entries": [{"key": "tenant", "value": tenant}]}]});
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let response = reqwest::Client::new()
            .post(format!("http://{http}/json"))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap())
    })
}

#[test]
fn usage_prints_every_limit_below_a_prefix_as_a_table() {
    let dir = tempfile::tempdir().unwrap();
    let (config, token) = (dir.path().join("api.yaml"), dir.path().join("read.token"));
    std::fs::write(&config, CONFIG).unwrap();
    std::fs::write(&token, "a-reader\n").unwrap();
    let serve = common::Serve::start_with(&config, &["--read-token-file", token.to_str().unwrap()]);
    json_request(&serve.http, "acme");
    let server = format!("http://{}", serve.http);
    let run = |env: Option<&str>, extra: &[&str]| {
        let mut command = common::tollgate(&[
            "usage",
            "--server",
            &server,
            "--domain",
            "api",
            "--entry",
            "tenant=acme",
        ]);
        command.args(extra);
        command
            .env_remove("TOLLGATE_READ_TOKEN")
            .env_remove("TOLLGATE_ADMIN_TOKEN");
        if let Some(token) = env {
            command.env("TOLLGATE_READ_TOKEN", token);
        }
        command.output().unwrap()
    };
    let output = run(Some("a-reader"), &[]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let table = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("DESCRIPTOR"), "{table}");
    let row = |prefix: &str| {
        lines
            .iter()
            .find(|line| line.starts_with(prefix))
            .unwrap_or_else(|| panic!("no row {prefix}: {table}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    // DESCRIPTOR, RULE, LIMIT, USED, REMAINING, RESETS AT.
    assert_eq!(row("tenant=acme ")[1..5], ["tenant", "2/DAY", "1", "1"], "{table}");
    assert_eq!(
        row("tenant=acme, path=/search")[2..6],
        ["tenant.path_/search", "50/HOUR", "0", "50"],
        "{table}"
    );
    assert!(table.contains("varies: tenant.path (tenant=acme, path=*)"), "{table}");
    // The JSON, and the token from a file.
    let output = run(None, &["--json", "--token-file", token.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(answer["usage"][0]["used"], 1);
    // No token: a usage error; a wrong one: the server's refusal.
    assert_eq!(run(None, &[]).status.code(), Some(2));
    let refused = run(Some("not-it"), &[]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("401"));
}

#[test]
fn a_refusal_names_its_rule_in_a_header_and_a_sampled_log_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("api.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    let mut command = common::tollgate(&["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"]);
    command
        .args([
            "--response-headers",
            "--policy-header",
            "x-ratelimit-policy",
            "--log-refusals",
            "1",
        ])
        .arg("--config")
        .arg(&config)
        .env("RESPONSE_DYNAMIC_METADATA", "true");
    let serve = common::Serve::start_command(command);
    for _ in 0..2 {
        let (status, answer) = json_request(&serve.http, "acme");
        assert_eq!(status, 200, "{answer}");
        let headers = answer["responseHeadersToAdd"].as_array().unwrap();
        assert!(
            headers.iter().all(|header| header["key"] != "x-ratelimit-policy"),
            "{answer}"
        );
    }
    let (status, answer) = json_request(&serve.http, "acme");
    assert_eq!(status, 429, "{answer}");
    let headers = answer["responseHeadersToAdd"].as_array().unwrap();
    let policy = headers.iter().find(|header| header["key"] == "x-ratelimit-policy");
    assert_eq!(
        policy.map(|header| &header["value"]),
        Some(&serde_json::json!("per-tenant")),
        "{answer}"
    );
    assert_eq!(answer["dynamicMetadata"]["refusedBy"], "per-tenant", "{answer}");
    let (stopped, logs) = serve.terminate();
    assert!(stopped);
    let refused: Vec<&String> = logs.iter().filter(|line| line.contains("refused")).collect();
    assert_eq!(refused.len(), 1, "{logs:?}");
    assert!(
        refused[0].contains("rule=\"per-tenant\"") || refused[0].contains("rule=per-tenant"),
        "{refused:?}"
    );
    assert!(refused[0].contains("tenant=acme"), "{refused:?}");

    // Not a share: refused at once.
    let output = common::tollgate(&["serve", "--config", config.to_str().unwrap(), "--log-refusals", "2"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("a share from 0 to 1"));
}

#[test]
fn configurations_applied_and_refused_are_events() {
    let dir = tempfile::tempdir().unwrap();
    let (config, token) = (dir.path().join("api.yaml"), dir.path().join("read.token"));
    std::fs::write(&config, CONFIG).unwrap();
    std::fs::write(&token, "a-reader\n").unwrap();
    let serve = common::Serve::start_with(&config, &["--read-token-file", token.to_str().unwrap()]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let events = || {
        runtime.block_on(async {
            reqwest::Client::new()
                .get(format!("http://{}/v1/events", serve.http))
                .bearer_auth("a-reader")
                .send()
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        })
    };
    // Writes `text` to the file, again each second until an event `found`
    // comes (a write made while the watcher was still starting is seen by
    // none).
    let until = |what: &str, text: &str, found: &dyn Fn(&serde_json::Value) -> bool| {
        let started = std::time::Instant::now();
        for poll in 0.. {
            if poll % 20 == 0 {
                std::fs::write(&config, text).unwrap();
            }
            let answer = events();
            if found(&answer) {
                return answer;
            }
            assert!(
                started.elapsed() < std::time::Duration::from_secs(15),
                "no {what}: {answer}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        unreachable!()
    };
    let wrong = CONFIG.replace("unit: hour", "unit: fortnight");
    let answer = until("refusal", &wrong, &|answer| {
        answer["events"][0]["kind"] == "config_refused"
    });
    let text = answer["events"][0]["text"].as_str().unwrap();
    assert!(text.contains("api.yaml:") && text.contains("fortnight"), "{text}");
    let answer = until("application", CONFIG, &|answer| answer["events"][0]["kind"] == "config");
    assert!(answer["events"][0]["id"].as_u64().unwrap() > answer["events"][1]["id"].as_u64().unwrap());
}
