//! The console in a real browser: headless Chromium over WebDriver
//! (Debian's `chromium` and `chromium-driver`, which scripts/test installs)
//! against two replicas on one redis-server. Screenshots of every page at
//! 1 280 × 800 and at a phone's width go to the target directory
//! (`console/*.png`).

mod common;
use tollgate_testkit::redis_server;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{call, config, on_port_0, OnPort0};
use fantoccini::{Client, ClientBuilder, Locator};
use redis_server::{free_port, RedisServer};
use serde_json::{json, Value};
use tollgate::{AnyStore, RedisStore};
use tollgate_server::http::AdminToken;
use tollgate_server::{Options, Server};

const ADMIN: &str = "console-admin-token";
const READER: &str = "console-read-token";
const HOSTILE: &str = "<img src=x onerror=alert(1)>";

/// Windows of a day at least: nothing ends while the test runs.
const CONFIG: &str = "
domain: llm
descriptors:
  - key: tenant
    rate_limit: {name: per-tenant, unit: day, requests_per_unit: 1000}
    descriptors:
      - key: model
        value: gpt-4
        rate_limit:
          name: gpt4-budget
          unit: month
          requests_per_unit: 5000000
          algorithm: {algorithm: fixed_window, limit: 5000000, calendar: month, time_zone: Europe/Paris, overage: record}
";

/// A chromedriver on a free loopback port, stopped (by pid) when dropped.
struct Driver {
    child: Child,
    port: u16,
}

impl Driver {
    fn start() -> Self {
        let binary = [
            "chromedriver",
            "/usr/bin/chromedriver",
            "/usr/lib/chromium/chromedriver",
        ]
        .into_iter()
        .find(|path| {
            Command::new(path)
                .arg("--version")
                .output()
                .is_ok_and(|out| out.status.success())
        })
        .expect("chromedriver is missing: apt-get install -y chromium chromium-driver (scripts/test does)");
        let port = free_port();
        let child = Command::new(binary)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        Self { child, port }
    }
}

/// The pids whose parent is `parent` (from `/proc/<pid>/stat`).
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                // After the command's closing parenthesis: state, then the parent's pid.
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(parent)
            })
        })
        .collect()
}

impl Drop for Driver {
    /// Stops the browsers chromedriver started (a test that failed never
    /// closed its session), then chromedriver: each by its pid.
    fn drop(&mut self) {
        for browser in children_of(self.child.id()) {
            let _ = Command::new("kill").arg(browser.to_string()).status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn browser(driver: &Driver) -> Client {
    let started = Instant::now();
    loop {
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".to_owned(),
            json!({"args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,800"]}),
        );
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match ClientBuilder::new(connector)
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{}", driver.port))
            .await
        {
            Ok(client) => return client,
            Err(error) => {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "no browser session: {error}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Polls `check` (a page's state) until it holds; panics with `what`.
async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "gave up waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn text(client: &Client, css: &str) -> String {
    match client.find(Locator::Css(css)).await {
        Ok(element) => element.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

async fn screenshot(client: &Client, name: &str) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console");
    std::fs::create_dir_all(&dir).unwrap();
    let png = client.screenshot().await.unwrap();
    std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
}

async fn page(client: &Client, name: &str) {
    client
        .find(Locator::Css(&format!("nav [data-page=\"{name}\"]")))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

async fn sign_in(client: &Client, base: &str, token: &str) {
    client.goto(&format!("{base}/console")).await.unwrap();
    let field = client.find(Locator::Css("#token")).await.unwrap();
    field.send_keys(token).await.unwrap();
    client
        .find(Locator::Css("#signin-form button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

async fn replica(redis: &RedisServer) -> OnPort0 {
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let options = Options {
        track_top: true,
        ..Options::default()
    };
    let server = Server::new(config(CONFIG), None, AnyStore::Redis(store), options)
        .admin_token(AdminToken::new(ADMIN).unwrap())
        .read_token(AdminToken::new(READER).unwrap());
    on_port_0(server).await
}

async fn envoy(server: &OnPort0, pairs: &[(&str, &str)], hits: u64) -> Value {
    let entries: Vec<Value> = pairs
        .iter()
        .map(|(key, value)| json!({"key": key, "value": value}))
        .collect();
    let body = json!({"domain": "llm", "descriptors": [{"entries": entries, "hits_addend": hits}]});
    call(
        reqwest::Method::POST,
        &format!("{}/json", server.http),
        None,
        Some(body),
    )
    .await
    .1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_a_real_browser() {
    let redis = RedisServer::start();
    let (a, b) = (replica(&redis).await, replica(&redis).await);
    for _ in 0..5 {
        envoy(&a, &[("tenant", "acme")], 1).await;
    }
    envoy(&a, &[("tenant", HOSTILE)], 1).await;
    // 900 of a limit of 1 000: the 100 past 80 % are near it.
    envoy(&a, &[("tenant", "busy")], 900).await;
    envoy(&a, &[("tenant", "acme"), ("model", "gpt-4")], 31_200).await;
    let driver = Driver::start();
    let client = browser(&driver).await;

    // A wrong token stays on the sign-in form.
    sign_in(&client, &a.http, "not-the-token").await;
    until("the refusal", || async {
        text(&client, "#signin-error").await.contains("refused")
    })
    .await;
    assert!(client
        .find(Locator::Css("#app"))
        .await
        .unwrap()
        .attr("hidden")
        .await
        .unwrap()
        .is_some());
    screenshot(&client, "signin").await;

    // The admin token: the overview.
    sign_in(&client, &a.http, ADMIN).await;
    until("the overview", || async {
        text(&client, "#overview").await.contains("redis")
    })
    .await;
    let overview = text(&client, "#overview").await;
    assert!(overview.contains("llm (2 rules)"), "{overview}");
    assert!(overview.contains("admin"), "{overview}");
    assert!(overview.contains("Decisions, last 10 s"), "{overview}");
    assert!(
        overview.contains("Last configuration refused\nnone since start"),
        "{overview}"
    );
    assert!(
        overview.contains("p99 latency, last minute") && overview.contains("RLQS streams"),
        "{overview}"
    );
    screenshot(&client, "overview").await;

    // Rules: the traffic in the chart's figures.
    page(&client, "rules").await;
    until("the rules' hits", || async {
        text(&client, "#rules")
            .await
            .contains("906 hits, 100 near the limit, 0 refused")
    })
    .await;
    screenshot(&client, "rules").await;

    // Top: the hostile value as text; no element made of it.
    page(&client, "top").await;
    until("the top list", || async {
        text(&client, "#top").await.contains(HOSTILE)
    })
    .await;
    let images = client
        .execute("return document.querySelectorAll('img').length", vec![])
        .await
        .unwrap();
    assert_eq!(images, json!(0), "a descriptor value became markup");
    screenshot(&client, "top").await;

    tenant_page(&client, &a).await;
    overrides_page(&client, &b).await;

    // Events: replica a's own, the override set and deleted through it.
    page(&client, "events").await;
    until("the override's events", || async {
        let events = text(&client, "#events").await;
        events.contains("override set: llm") && events.contains("override deleted: llm")
    })
    .await;
    screenshot(&client, "events").await;

    phone_width(&client).await;
    read_only(&client, &a).await;
    client.close().await.unwrap();
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn the_console_is_off_without_a_token_and_strict_with_one() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let off = on_port_0(Server::new(
        config(CONFIG),
        None,
        AnyStore::Redis(store),
        Options::default(),
    ))
    .await;
    assert_eq!(off.get("/console").await.status().as_u16(), 404);
    off.stop().await;
    let on = replica(&redis).await;
    for (path, kind) in [
        ("/console", "text/html"),
        ("/console/console.js", "text/javascript"),
        ("/console/console.css", "text/css"),
    ] {
        let response = on.get(path).await;
        assert_eq!(response.status().as_u16(), 200, "{path}");
        let header = |name: &str| response.headers()[name].to_str().unwrap().to_owned();
        assert!(header("content-type").starts_with(kind), "{path}");
        let policy = header("content-security-policy");
        for part in ["default-src 'none'", "script-src 'self'", "frame-ancestors 'none'"] {
            assert!(policy.contains(part), "{path}: {policy}");
        }
        assert!(!policy.contains("unsafe-inline"), "{policy}");
        assert_eq!(header("x-content-type-options"), "nosniff");
    }
    let page = on.text("/console").await;
    assert!(
        !page.contains("<script>") && !page.contains("style="),
        "inline script or style"
    );
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "the page names another origin"
    );
    on.stop().await;
}

/// Tenant: the calendar budget as `/v1/usage` reports it.
async fn tenant_page(client: &Client, a: &OnPort0) {
    page(client, "tenant").await;
    client
        .find(Locator::Css("#tenant-entries"))
        .await
        .unwrap()
        .send_keys("tenant=acme")
        .await
        .unwrap();
    client
        .find(Locator::Css("#tenant-form button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until("the tenant's limits", || async {
        text(client, "#tenant").await.contains("model=gpt-4")
    })
    .await;
    let (_, usage) = call(
        reqwest::Method::GET,
        &format!("{}/v1/usage?domain=llm&tenant=acme", a.http),
        Some(READER),
        None,
    )
    .await;
    let budget = &usage["usage"][1];
    let shown = text(client, "#tenant").await;
    for expected in [
        format!("{} / {}", budget["used"], budget["limit"]),
        budget["remaining"].to_string(),
        budget["resets_at"].as_str().unwrap().to_owned(),
    ] {
        assert!(shown.contains(&expected), "{expected} not in {shown}");
    }
    screenshot(client, "tenant").await;
}

/// Overrides: a bad value is named beside its field; a good one is
/// enforced on the other replica within a second; its delete restores the
/// rule.
async fn overrides_page(client: &Client, b: &OnPort0) {
    // Overrides: a bad value is named beside its field; a good one is
    // enforced on the other replica within a second; its delete restores the rule.
    page(client, "overrides").await;
    let field = |css: &'static str| {
        let client = client.clone();
        async move { client.find(Locator::Css(css)).await.unwrap() }
    };
    field("#o-entries").await.send_keys("tenant=acme").await.unwrap();
    field("#o-requests").await.send_keys("0").await.unwrap();
    field("#o-unit").await.send_keys("day").await.unwrap();
    field("#override-form button[type=submit]").await.click().await.unwrap();
    until("the field's error", || async {
        text(client, "[data-for=\"rate_limit.requests_per_unit\"]")
            .await
            .contains("at least 1")
    })
    .await;
    screenshot(client, "override-error").await;
    field("#o-requests").await.clear().await.unwrap();
    field("#o-requests").await.send_keys("2").await.unwrap();
    field("#override-form button[type=submit]").await.click().await.unwrap();
    let set_at = Instant::now();
    until("the override listed", || async {
        text(client, "#overrides").await.contains("tenant=acme")
    })
    .await;
    let limit_on_b =
        || async { envoy(b, &[("tenant", "acme")], 0).await["statuses"][0]["currentLimit"]["requestsPerUnit"].clone() };
    until("replica b enforcing the override", || async {
        limit_on_b().await == json!(2)
    })
    .await;
    let reached = set_at.elapsed();
    assert!(reached < Duration::from_secs(1), "the other replica took {reached:?}");
    screenshot(client, "overrides").await;
    // The list is drawn again each second: a button found just before may
    // be gone by the click, so it is found again until the click lands.
    until("the delete clicked", || async {
        match client.find(Locator::Css("#overrides button")).await {
            Ok(button) => button.click().await.is_ok(),
            Err(_) => false,
        }
    })
    .await;
    until("the override gone", || async {
        text(client, "#overrides").await.contains("No override")
    })
    .await;
    until("replica b back on the rule", || async {
        limit_on_b().await == json!(1000)
    })
    .await;
}

/// A phone's width: every page.
async fn phone_width(client: &Client) {
    client.set_window_size(390, 844).await.unwrap();
    for name in ["overview", "rules", "top", "tenant", "overrides", "events"] {
        page(client, name).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        screenshot(client, &format!("phone-{name}")).await;
    }
    client.set_window_size(1280, 800).await.unwrap();
}

/// The read-only token sees and changes nothing.
async fn read_only(client: &Client, a: &OnPort0) {
    client
        .find(Locator::Css("#signout"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    sign_in(client, &a.http, READER).await;
    until("the read-only overview", || async {
        text(client, "#overview").await.contains("read-only")
    })
    .await;
    page(client, "overrides").await;
    until("the form hidden from the read-only token", || async {
        let script = "return getComputedStyle(document.getElementById('override-form')).display";
        client.execute(script, vec![]).await.unwrap() == json!("none")
    })
    .await;
    screenshot(client, "overrides-read-only").await;
}
