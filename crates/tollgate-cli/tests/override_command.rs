//! `tollgate override set | list | delete` against a running `tollgate
//! serve`: the token from a file or the environment, the server's answer
//! printed, its refusals as errors.

mod common;

use serde_json::Value;

const CONFIG: &str = "
domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 100}
";

#[test]
fn set_list_and_delete_through_a_running_server() {
    let dir = tempfile::tempdir().unwrap();
    let (config, token) = (dir.path().join("api.yaml"), dir.path().join("admin.token"));
    std::fs::write(&config, CONFIG).unwrap();
    std::fs::write(&token, "t0ken-of-the-admin\n").unwrap();
    let serve = common::Serve::start_with(&config, &["--admin-token-file", token.to_str().unwrap()]);
    let server = format!("http://{}", serve.http);
    let run = |args: &[&str], token_env: Option<&str>| {
        let mut command = common::tollgate(&["override"]);
        command.args(args).args(["--server", &server]);
        command.env_remove("TOLLGATE_ADMIN_TOKEN");
        if let Some(token) = token_env {
            command.env("TOLLGATE_ADMIN_TOKEN", token);
        }
        let output = command.output().unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let token_file = ["--token-file", token.to_str().unwrap()];
    let set = [
        "set",
        "--domain",
        "api",
        "--entry",
        "tenant=acme",
        "--unit",
        "minute",
        "--requests-per-unit",
        "2",
        "--reason",
        "upgrade",
    ];
    // No token anywhere: refused before any request.
    let (code, _, stderr) = run(&set, None);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("TOLLGATE_ADMIN_TOKEN"), "{stderr}");
    // A wrong token: the server's 401.
    let (code, _, stderr) = run(&set, Some("wrong"));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("401"), "{stderr}");
    // The token from the environment.
    let (code, stdout, stderr) = run(&set, Some("t0ken-of-the-admin"));
    assert_eq!(code, Some(0), "{stderr}");
    let answer: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(answer["override"]["rate_limit"]["requests_per_unit"], 2);
    assert_eq!(answer["override"]["reason"], "upgrade");
    // From a file; bad input is the server's 400, exit code 2.
    let bad = [
        "set",
        "--domain",
        "api",
        "--entry",
        "tenant=acme",
        "--unit",
        "fortnight",
        "--requests-per-unit",
        "2",
    ];
    let (code, _, stderr) = run(&[&bad[..], &token_file[..]].concat(), None);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("invalid rate limit unit \"fortnight\""), "{stderr}");
    let (code, stdout, stderr) = run(&[&["list", "--domain", "api"][..], &token_file[..]].concat(), None);
    assert_eq!(code, Some(0), "{stderr}");
    let listed: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(listed["overrides"].as_array().unwrap().len(), 1);
    let delete = ["delete", "--domain", "api", "--entry", "tenant=acme"];
    let (code, stdout, stderr) = run(&[&delete[..], &token_file[..]].concat(), None);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("\"deleted\""), "{stdout}");
    let (code, _, stderr) = run(&[&delete[..], &token_file[..]].concat(), None);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("no override is set"), "{stderr}");
    let (clean, _) = serve.terminate();
    assert!(clean);
}
