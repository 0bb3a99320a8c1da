//! Usage (`/v1/usage`): where each descriptor stands, read without
//! consuming, on every store and engine; the prefix listing, a page at a
//! time; who may read it.

mod common;
use tollgate_testkit::redis_server;

use common::{call, config, on_port_0, OnPort0};
use redis_server::RedisServer;
use serde_json::{json, Value};
use tollgate::{AnyStore, MemoryStore, RedisStore};
use tollgate_server::http::AdminToken;
use tollgate_server::{Options, Server};

const ADMIN: &str = "usage-admin-token";
const READER: &str = "usage-read-token";

/// A tenant's requests a day, a calendar month's token budget in a time
/// zone (counted as reported), any model's daily requests, a shadow rule
/// and an unlimited one. Windows of a day at least: the store's key count
/// must not change while a test runs (a shorter window's key would expire).
const CONFIG: &str = "
domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 100}
    descriptors:
      - key: model
        value: gpt-4
        rate_limit:
          name: gpt4-budget
          unit: month
          requests_per_unit: 5000000
          algorithm: {algorithm: fixed_window, limit: 5000000, calendar: month, time_zone: Europe/Paris, overage: record}
      - key: model
        rate_limit: {unit: day, requests_per_unit: 1000}
      - key: tool
        value: search
        shadow_mode: true
        rate_limit: {unit: day, requests_per_unit: 5}
      - key: tool
        value: echo
        rate_limit: {unlimited: true}
";

fn entries(pairs: &[(&str, &str)]) -> Value {
    pairs
        .iter()
        .map(|(key, value)| json!({"key": key, "value": value}))
        .collect()
}

async fn serve(store: AnyStore) -> OnPort0 {
    let server = Server::new(config(CONFIG), None, store, Options::default())
        .admin_token(AdminToken::new(ADMIN).unwrap())
        .read_token(AdminToken::new(READER).unwrap());
    on_port_0(server).await
}

/// Envoy's `/json` for `descriptors`, each `(entries, hits)`.
async fn envoy(server: &OnPort0, descriptors: &[(&[(&str, &str)], u64)]) -> Value {
    let descriptors: Vec<Value> = descriptors
        .iter()
        .map(|(pairs, hits)| json!({"entries": entries(pairs), "hits_addend": hits}))
        .collect();
    let body = json!({"domain": "llm", "descriptors": descriptors});
    call(
        reqwest::Method::POST,
        &format!("{}/json", server.http),
        None,
        Some(body),
    )
    .await
    .1
}

const ACME: &[(&str, &str)] = &[("tenant", "acme")];
const ACME_GPT4: &[(&str, &str)] = &[("tenant", "acme"), ("model", "gpt-4")];
const ACME_MINI: &[(&str, &str)] = &[("tenant", "acme"), ("model", "mini")];
const ACME_SEARCH: &[(&str, &str)] = &[("tenant", "acme"), ("tool", "search")];
const ACME_ECHO: &[(&str, &str)] = &[("tenant", "acme"), ("tool", "echo")];
const BETA: &[(&str, &str)] = &[("tenant", "beta")];
const NOTHING: &[(&str, &str)] = &[("region", "eu")];

/// A mixed sequence on `server`: checks, token reports, an override; then
/// `/v1/usage` agrees with what `/json` reports (a peek), field by field,
/// and `keys` (the store's key count) is the same before and after it.
async fn agrees_and_writes_nothing(server: &OnPort0, keys: impl Fn() -> usize) {
    for _ in 0..7 {
        envoy(server, &[(ACME, 1)]).await;
    }
    // Token reports after the fact (a calendar month's budget in Paris).
    envoy(server, &[(ACME_GPT4, 1_200)]).await;
    envoy(server, &[(ACME_GPT4, 30_000)]).await;
    envoy(server, &[(ACME_MINI, 3)]).await;
    envoy(server, &[(ACME_SEARCH, 9)]).await;
    // An override for beta: 2 a minute, used once.
    let body =
        json!({"domain": "llm", "descriptor": entries(BETA), "rate_limit": {"unit": "day", "requests_per_unit": 2}});
    let (status, answer) = call(
        reqwest::Method::PUT,
        &format!("{}/v1/overrides", server.http),
        Some(ADMIN),
        Some(body),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    envoy(server, &[(BETA, 1)]).await;

    let asked: &[&[(&str, &str)]] = &[ACME, ACME_GPT4, ACME_MINI, ACME_SEARCH, ACME_ECHO, BETA, NOTHING];
    let before = keys();
    let descriptors: Vec<Value> = asked.iter().map(|pairs| json!({"entries": entries(pairs)})).collect();
    let usage_url = format!("{}/v1/usage", server.http);
    let (status, usage) = call(
        reqwest::Method::POST,
        &usage_url,
        Some(READER),
        Some(json!({"domain": "llm", "descriptors": descriptors})),
    )
    .await;
    assert_eq!(status, 200, "{usage}");
    assert_eq!(keys(), before, "a usage request wrote to the store");
    let rows = usage["usage"].as_array().unwrap();
    assert_eq!(rows.len(), asked.len());
    // What /json reports for the same descriptors, each alone, as a peek.
    for (row, pairs) in rows.iter().zip(asked) {
        let peek = envoy(server, &[(pairs, 0)]).await;
        let status = &peek["statuses"][0];
        assert_eq!(row["descriptor"], entries(pairs));
        if row["limit"].is_u64() && row["unlimited"] == false {
            let remaining = status["limitRemaining"].as_u64().unwrap_or(0);
            assert_eq!(row["remaining"].as_u64().unwrap(), remaining, "{row} against {status}");
            assert_eq!(
                row["limit"].as_u64().unwrap(),
                status["currentLimit"]["requestsPerUnit"].as_u64().unwrap(),
                "{row}"
            );
            let reset = status["durationUntilReset"].as_str().unwrap().trim_end_matches('s');
            let reset: u64 = reset.parse().unwrap();
            let ours = row["reset_after_ms"].as_u64().unwrap().div_ceil(1_000);
            assert!(ours.abs_diff(reset) <= 1, "{row} against {status}");
        }
    }
    assert_eq!(keys(), before, "a peek through /json wrote to the store");
    let row = |index: usize| &rows[index];
    assert_eq!(row(0)["rule"], "tenant");
    assert_eq!(row(0)["used"], 7);
    assert_eq!(row(0)["remaining"], 93);
    assert_eq!(row(0)["unit"], "DAY");
    // The month's budget: what was reported, reset at the month's end in Paris.
    assert_eq!(row(1)["name"], "gpt4-budget");
    assert_eq!(row(1)["used"], 31_200);
    assert_eq!(row(1)["remaining"], 5_000_000 - 31_200);
    assert_eq!(row(1)["algorithm"]["calendar"], "month");
    let resets_at: jiff::Timestamp = row(1)["resets_at"].as_str().unwrap().parse().unwrap();
    let in_paris = resets_at.in_tz("Europe/Paris").unwrap();
    assert_eq!(
        (in_paris.day(), in_paris.hour(), in_paris.minute()),
        (1, 0, 0),
        "{in_paris}"
    );
    assert_eq!(row(2)["rule"], "tenant.model");
    assert_eq!(row(2)["used"], 3);
    assert_eq!(row(3)["shadow_mode"], true);
    assert_eq!(row(3)["used"], 5, "a shadow rule counts (up to its limit)");
    assert_eq!(row(4)["unlimited"], true);
    assert_eq!(row(4)["limit"], Value::Null);
    assert_eq!(row(5)["override"], true);
    assert_eq!(row(5)["limit"], 2);
    assert_eq!(row(5)["used"], 1);
    assert_eq!(row(6)["rule"], Value::Null);
    assert_eq!(row(6)["limit"], Value::Null);

    lists_below_the_prefix(server).await;
    assert_eq!(keys(), before, "the listing wrote to the store");
    lists_every_varying_descriptor_held(server).await;
}

/// The prefix `tenant=acme`: the tenant's own rule, the fixed-value rules
/// below it, and the rule whose model varies; then a page at a time.
async fn lists_below_the_prefix(server: &OnPort0) {
    let usage_url = format!("{}/v1/usage", server.http);
    let (status, page) = call(
        reqwest::Method::GET,
        &format!("{usage_url}?domain=llm&tenant=acme"),
        Some(READER),
        None,
    )
    .await;
    assert_eq!(status, 200, "{page}");
    let listed: Vec<&Value> = page["usage"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| &row["rule"])
        .collect();
    // Then the descriptors of the rule whose model varies that the store
    // holds state for (mini; gpt-4's is its own rule's).
    assert_eq!(
        listed,
        [
            "tenant",
            "tenant.model_gpt-4",
            "tenant.tool_search",
            "tenant.tool_echo",
            "tenant.model"
        ]
    );
    assert_eq!(page["usage"][1]["used"], 31_200);
    assert_eq!(page["usage"][4]["descriptor"], entries(ACME_MINI));
    assert_eq!(page["usage"][4]["used"], 3);
    assert_eq!(page["cursor"], Value::Null);
    assert_eq!(page["varying"][0]["rule"], "tenant.model");
    assert_eq!(
        page["varying"][0]["descriptor"][1],
        json!({"key": "model", "value": null})
    );
    // A page at a time: the cursor walks the same rows.
    let walked = walk(server, "tenant=acme", 1).await;
    let walked: Vec<Value> = walked.iter().map(|row| row["rule"].clone()).collect();
    assert_eq!(walked, listed.into_iter().cloned().collect::<Vec<_>>());
}

/// Every row of the listing below `prefix`, `limit` a page, following the
/// cursor: no page longer than `limit`.
async fn walk(server: &OnPort0, prefix: &str, limit: usize) -> Vec<Value> {
    let mut walked = Vec::new();
    let mut cursor = String::new();
    for _ in 0..10_000 {
        let url = format!("{}/v1/usage?domain=llm&{prefix}&limit={limit}{cursor}", server.http);
        let (status, page) = call(reqwest::Method::GET, &url, Some(ADMIN), None).await;
        assert_eq!(status, 200, "{page}");
        let rows = page["usage"].as_array().unwrap();
        assert!(rows.len() <= limit, "{page}");
        walked.extend(rows.iter().cloned());
        match page["cursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => return walked,
        }
    }
    panic!("the listing below {prefix} never ended");
}

/// A tenant with more models than a page: each listed once, across pages.
async fn lists_every_varying_descriptor_held(server: &OnPort0) {
    for model in 0..150 {
        envoy(server, &[(&[("tenant", "many"), ("model", &format!("m{model}"))], 1)]).await;
    }
    let walked = walk(server, "tenant=many", 40).await;
    let mut models: Vec<String> = walked
        .iter()
        .filter(|row| row["rule"] == "tenant.model")
        .map(|row| {
            assert_eq!(row["used"], 1, "{row}");
            row["descriptor"][1]["value"].as_str().unwrap().to_owned()
        })
        .collect();
    models.sort();
    models.dedup();
    assert_eq!(models.len(), 150, "{models:?}");
}

#[tokio::test]
async fn usage_on_memory_agrees_with_envoys_answers() {
    let store = MemoryStore::new();
    let server = serve(AnyStore::Memory(store.clone())).await;
    agrees_and_writes_nothing(&server, || store.len()).await;
    server.stop().await;
}

async fn on_redis(redis: &RedisServer, engine: &str) {
    let store = RedisStore::connect(&format!("{}?engine={engine}", redis.url()))
        .await
        .unwrap();
    assert_eq!(store.engine().name(), engine);
    let server = serve(AnyStore::Redis(store)).await;
    let keys = || redis.cli(&["DBSIZE"]).parse::<usize>().unwrap();
    agrees_and_writes_nothing(&server, keys).await;
    server.stop().await;
}

#[tokio::test]
async fn usage_on_redis_with_lua_agrees_and_writes_nothing() {
    on_redis(&RedisServer::start(), "lua").await;
}

#[tokio::test]
async fn usage_on_redis_with_the_module_agrees_and_writes_nothing() {
    on_redis(&RedisServer::start_with_module(&[]), "module").await;
}

#[tokio::test]
async fn who_may_read_usage() {
    let off = on_port_0(Server::new(
        config(CONFIG),
        None,
        AnyStore::Memory(MemoryStore::new()),
        Options::default(),
    ))
    .await;
    let body = json!({"domain": "llm", "descriptors": [{"entries": entries(ACME)}]});
    let (status, answer) = call(
        reqwest::Method::POST,
        &format!("{}/v1/usage", off.http),
        Some(READER),
        Some(body.clone()),
    )
    .await;
    assert_eq!(status, 404);
    assert!(
        answer["error"].as_str().unwrap().contains("--read-token-file"),
        "{answer}"
    );
    off.stop().await;

    let server = serve(AnyStore::Memory(MemoryStore::new())).await;
    let url = format!("{}/v1/usage", server.http);
    for token in [None, Some("wrong"), Some("usage-read-toke"), Some("usage-read-token-")] {
        let (status, _) = call(reqwest::Method::POST, &url, token, Some(body.clone())).await;
        assert_eq!(status, 401, "{token:?}");
        let (status, _) = call(reqwest::Method::GET, &format!("{url}?domain=llm"), token, None).await;
        assert_eq!(status, 401, "{token:?}");
    }
    for token in [ADMIN, READER] {
        let (status, _) = call(reqwest::Method::POST, &url, Some(token), Some(body.clone())).await;
        assert_eq!(status, 200);
    }
    // The read-only token lists overrides and changes none.
    let overrides = format!("{}/v1/overrides", server.http);
    let (status, _) = call(reqwest::Method::GET, &overrides, Some(READER), None).await;
    assert_eq!(status, 200);
    let change =
        json!({"domain": "llm", "descriptor": entries(BETA), "rate_limit": {"unit": "day", "requests_per_unit": 2}});
    let (status, answer) = call(reqwest::Method::PUT, &overrides, Some(READER), Some(change)).await;
    assert_eq!(status, 403, "{answer}");
    // Bad input: a 400 naming what is wrong, and the server goes on.
    for (query, says) in [
        ("", "domain is required"),
        ("?domain=nope", "domain \"nope\" is not configured"),
        ("?domain=llm&limit=0", "limit must be from 1 to 1000"),
        ("?domain=llm&limit=many", "limit: \"many\" is not a number"),
        ("?domain=llm&cursor=x", "cursor: \"x\""),
        ("?domain=llm&=acme", "an entry of the prefix has no key"),
    ] {
        let (status, answer) = call(reqwest::Method::GET, &format!("{url}{query}"), Some(READER), None).await;
        assert_eq!(status, 400, "{query}: {answer}");
        assert!(answer["error"].as_str().unwrap().contains(says), "{query}: {answer}");
    }
    for (body, says) in [
        (
            json!({"domain": "llm", "descriptors": []}),
            "descriptors must not be empty",
        ),
        (
            json!({"domain": "llm", "descriptors": [{"entries": []}]}),
            "descriptors[0] has no entries",
        ),
        (
            json!({"domain": "llm", "descriptors": [{"entries": [{"key": 1}]}]}),
            "descriptors[0].entries[0].key",
        ),
    ] {
        let (status, answer) = call(reqwest::Method::POST, &url, Some(READER), Some(body)).await;
        assert_eq!(status, 400, "{answer}");
        assert!(answer["error"].as_str().unwrap().contains(says), "{answer}");
    }
    let (status, _) = call(reqwest::Method::POST, &url, Some(READER), Some(body)).await;
    assert_eq!(status, 200);
    server.stop().await;
}
