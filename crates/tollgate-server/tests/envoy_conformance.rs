//! Conformance with envoyproxy/ratelimit: its documented behaviours,
//! re-typed from its README, its `test/config` fixtures and its service
//! tests (`test/service/ratelimit_test.go`, `test/config/config_test.go`),
//! each test naming the one it encodes.
//!
//! Limits whose upstream example counts per second are counted per hour or
//! day here where a test exhausts them, so that no test can cross a window
//! boundary half-way; the behaviour is the same for every unit.

mod common;

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::{json, Value};
use tollgate::{AnyStore, MemoryStore};
use tollgate_server::config::Domain;
use tollgate_server::{Config, HeaderNames, LoadOptions, Options, Server};

use common::rls::{descriptor, statuses, OK, OVER_LIMIT};
use common::{on_port_0, OnPort0};

const SECOND: i32 = 1;
const MINUTE: i32 = 2;
const HOUR: i32 = 3;
const DAY: i32 = 4;

// --- Harness. -----------------------------------------------------------------

/// A server on port 0 over the memory store, stopped when dropped.
struct Running {
    server: OnPort0,
    _dir: tempfile::TempDir,
}

async fn serve(config: &str, options: Options) -> Running {
    serve_files(&[("config.yaml", config)], options).await
}

async fn serve_files(files: &[(&str, &str)], options: Options) -> Running {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let config = Config::load(dir.path()).unwrap();
    let server = Server::new(config, None, AnyStore::Memory(MemoryStore::new()), options);
    Running {
        server: on_port_0(server).await,
        _dir: dir,
    }
}

impl Running {
    async fn call(&self, request: RateLimitRequest) -> RateLimitResponse {
        self.try_call(request).await.unwrap()
    }

    async fn try_call(&self, request: RateLimitRequest) -> Result<RateLimitResponse, tonic::Status> {
        let mut client = RateLimitServiceClient::connect(self.server.grpc_url()).await.unwrap();
        client.should_rate_limit(request).await.map(tonic::Response::into_inner)
    }

    async fn json(&self, body: &Value) -> (u16, Value) {
        let response = reqwest::Client::new()
            .post(format!("{}/json", self.server.http))
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.json().await.unwrap_or(Value::Null))
    }

    async fn metrics(&self) -> String {
        self.server.text("/metrics").await
    }
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

fn one(domain: &str, entries: &[(&str, &str)]) -> RateLimitRequest {
    request(domain, vec![descriptor(entries)])
}

fn parse(text: &str) -> Result<Domain, tollgate_server::ConfigError> {
    Domain::parse(text, Path::new("config.yaml"))
}

/// The rule a descriptor meets: (requests_per_unit, stat key), or None.
fn lookup(domain: &Domain, entries: &[(&str, &str)]) -> Option<(Option<u64>, String)> {
    let entries: Vec<(String, String)> = entries
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect();
    domain
        .lookup(&entries)
        .map(|found| (found.rule.requests_per_unit, found.stat_key().to_owned()))
}

fn seconds_to_window_end(window: u64) -> u64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    window - now % window
}

// --- Fixtures of test/config, re-typed. --------------------------------------

const BASIC_CONFIG: &str = r"# Basic configuration for testing.
domain: test-domain
descriptors:
  # Top level key/value with no default rate limit.
  - key: key1
    value: value1
    descriptors:
      # 2nd level key only with default rate limit.
      - key: subkey1
        rate_limit:
          unit: second
          requests_per_unit: 5

      # 2nd level key/value with limit. Specific override at 2nd level.
      - key: subkey1
        value: subvalue1
        rate_limit:
          unit: second
          requests_per_unit: 10

  # Top level key only with default rate limit.
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20

  # Top level key/value with limit. Specific override at 1st level.
  - key: key2
    value: value2
    rate_limit:
      unit: minute
      requests_per_unit: 30

  # First level override with no limit. This effectively whitelists the value.
  - key: key2
    value: value3

  - key: key3
    rate_limit:
      unit: hour
      requests_per_unit: 1

  - key: key4
    rate_limit:
      name: key4_rate_limit
      unit: day
      requests_per_unit: 1

  - key: key5
    value: value5
    rate_limit:
      unit: day
      requests_per_unit: 15
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit:
          unit: day
          requests_per_unit: 25

  - key: key6
    rate_limit:
      unlimited: true

  # Top level key only with default rate limit.

  - key: key7
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 70
";

const METADATA: &str = r"domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit:
          unit: second
          requests_per_unit: 5
        metadata:
          name: service_1
      - key: subkey1
        value: subvalue1
        rate_limit:
          unit: second
          requests_per_unit: 10
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
    metadata:
      service_with_quota:
        name: service_2
";

const SHADOWMODE_CONFIG: &str = r"domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit:
          unit: second
          requests_per_unit: 5
      - key: subkey1
        value: subvalue1
        rate_limit:
          unit: second
          requests_per_unit: 10
        shadow_mode: true
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
    shadow_mode: true
  - key: key2
    value: value2
    rate_limit:
      unit: minute
      requests_per_unit: 30
";

const SHARE_THRESHOLD: &str = r"# Configuration for testing share_threshold feature
domain: test-domain
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 100
  - key: nested
    value: parent
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit:
          unit: minute
          requests_per_unit: 200
  - key: files
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit:
          unit: minute
          requests_per_unit: 300
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit:
          unit: minute
          requests_per_unit: 60
  - key: service
    value: svc/*
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit:
          unit: minute
          requests_per_unit: 80
  - key: path
    value: path/*
    share_threshold: true
    descriptors:
      - key: file
        value: file/*
        share_threshold: false
        descriptors:
          - key: type
            rate_limit:
              unit: minute
              requests_per_unit: 120
  - key: user
    value: user/*
    share_threshold: true
    descriptors:
      - key: resource
        value: res/*
        share_threshold: true
        descriptors:
          - key: action
            rate_limit:
              unit: minute
              requests_per_unit: 150
  - key: file
    value: test1
    rate_limit:
      unit: minute
      requests_per_unit: 50
  - key: file
    value: test*
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 100
  - key: midpath
    value: /api*v1
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 100
  - key: multiroute
    value: svc*ep*rpc
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 50
  - key: midroute
    value: /api*v2
    share_threshold: true
    value_to_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 80
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - key: resource
        value: res*v2
        share_threshold: true
        rate_limit:
          unit: minute
          requests_per_unit: 60
";

const WILDCARD: &str = r"domain: test-domain
descriptors:
  - key: wild
    value: foo*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: noWild
    value: foo
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: noVal
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: midWild
    value: bar*b
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: multiWild
    value: foo*bar*baz
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit:
          unit: minute
          requests_per_unit: 20
";

const MERGE_DOMAIN_KEY1: &str = r"domain: test-domain
descriptors:
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 10
";

const MERGE_DOMAIN_KEY2: &str = r"domain: test-domain
descriptors:
  - key: key2
    value: value2
    rate_limit:
      unit: minute
      requests_per_unit: 20
";

/// test/config: every fixture envoyproxy/ratelimit loads (basic_config,
/// metadata, shadowmode_config, share_threshold, wildcard) loads here.
#[test]
fn fixtures_it_accepts_load() {
    for (name, text) in [
        ("basic_config.yaml", BASIC_CONFIG),
        ("metadata.yaml", METADATA),
        ("shadowmode_config.yaml", SHADOWMODE_CONFIG),
        ("share_threshold.yaml", SHARE_THRESHOLD),
        ("wildcard.yaml", WILDCARD),
        ("merge_domain_key1.yaml", MERGE_DOMAIN_KEY1),
        ("merge_domain_key2.yaml", MERGE_DOMAIN_KEY2),
    ] {
        let domain = parse(text).unwrap_or_else(|error| panic!("{name}: {error}"));
        assert_eq!(domain.domain, "test-domain", "{name}");
    }
}

/// test/config: every fixture envoyproxy/ratelimit refuses is refused, for
/// the same fault, with file and line (TestBadLimitUnit, TestBadYaml,
/// TestDuplicateKey, TestEmptyDomain, TestEmptyKey, TestMisspelledKey,
/// TestNonStringKey, TestNonMapList, TestReplacesSelf, TestReplacesEmpty,
/// TestUnlimitedWithRateLimitUnit; share_threshold without a wildcard).
#[test]
fn fixtures_it_refuses_are_refused_with_file_and_line() {
    for (name, text, expected) in [
        (
            "bad_limit_unit.yaml",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: foo\n      requests_per_unit: 5\n",
            "invalid rate limit unit \"foo\"",
        ),
        ("bad_yaml.yaml", "'''\n", ""),
        (
            "duplicate_key.yaml",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n\n  - key: key1\n    value: value1\n",
            "duplicate descriptor composite key \"test-domain.key1_value1\"",
        ),
        ("empty_domain.yaml", "descriptors:\n", "config file cannot have empty domain"),
        (
            "empty_key.yaml",
            "domain: test-domain\ndescriptors:\n  - value: value1\n",
            "descriptor has empty key",
        ),
        (
            "misspelled_key.yaml",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    ratelimit:\n      unit: day\n      requests_per_unit: 5\n",
            "unknown key \"ratelimit\"",
        ),
        (
            "misspelled_key2.yaml",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n",
            "unknown key \"requestsperunit\"",
        ),
        (
            "non_map_list.yaml",
            "domain: test-domain\ndescriptors:\n  - a\n  - b\n  - c\n",
            "a list holds something other than a map: a",
        ),
        (
            "non_string_key.yaml",
            "0.25: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: day\n      requests_per_unit: 5\n",
            "key is not of type string: 0.25",
        ),
        (
            "replaces_empty.yaml",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    descriptors:\n      - key: subkey1\n        rate_limit:\n          name: self\n          replaces:\n            - name:\n          unit: second\n          requests_per_unit: 5\n",
            "should not have an empty replaces entry",
        ),
        (
            "replaces_self.yaml",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    descriptors:\n      - key: subkey1\n        rate_limit:\n          name: self\n          replaces:\n            - name: self\n          unit: second\n          requests_per_unit: 5\n",
            "replaces should not contain name of same descriptor",
        ),
        (
            "unlimited_with_unit.yaml",
            "domain: test-domain\ndescriptors:\n  - key: foo\n    rate_limit:\n      unlimited: true\n      unit: day\n      requests_per_unit: 25\n",
            "should not specify rate limit unit when unlimited",
        ),
        (
            "share_threshold without a wildcard",
            "domain: test-domain\ndescriptors:\n  - key: files\n    value: exact\n    share_threshold: true\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1\n",
            "share_threshold can only be used with wildcard values",
        ),
    ] {
        let error = Domain::parse(text, Path::new(name)).expect_err(name);
        let message = error.to_string();
        assert!(message.starts_with(&format!("{name}:")), "{message}");
        assert!(message.contains(expected), "{name}: {message} lacks {expected}");
        assert!(error.line.is_some(), "{name}: no line in {message}");
    }
}

/// TestDuplicateDomain: two files of one domain are refused (naming both);
/// TestDomainMerge: with MERGE_DOMAIN_CONFIG they are merged;
/// TestDuplicateKeyDomainMerge: a descriptor in both is still refused.
#[test]
fn domains_in_two_files_are_refused_or_merged() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.yaml"), MERGE_DOMAIN_KEY1).unwrap();
    std::fs::write(dir.path().join("b.yaml"), MERGE_DOMAIN_KEY2).unwrap();
    let error = Config::load(dir.path()).unwrap_err().to_string();
    assert!(error.contains("duplicate domain \"test-domain\""), "{error}");
    assert!(error.contains("a.yaml") && error.contains("b.yaml"), "{error}");

    let merge = LoadOptions {
        merge_domains: true,
        ..LoadOptions::default()
    };
    let config = Config::load_with(dir.path(), merge).unwrap();
    let domain = &config.domains["test-domain"];
    assert_eq!(lookup(domain, &[("key1", "value1")]).unwrap().0, Some(10));
    assert_eq!(lookup(domain, &[("key2", "value2")]).unwrap().0, Some(20));

    std::fs::write(dir.path().join("b.yaml"), MERGE_DOMAIN_KEY1).unwrap();
    let error = Config::load_with(dir.path(), merge).unwrap_err().to_string();
    assert!(
        error.contains("duplicate descriptor composite key \"test-domain.key1_value1\""),
        "{error}"
    );
}

/// envoyproxy/ratelimit reads every key of its schema anywhere and ignores
/// it where it means nothing (its key check is one set for the whole file),
/// reads scalars as written, YAML 1.1 booleans, and `value: ""` as no value.
#[test]
fn its_lenient_reading_is_kept() {
    let domain = parse(
        "domain: 42\ndescriptors:\n  - key: zip\n    value: 01234\n    unit: ignored here\n    rate_limit:\n      unit: Minute\n      requests_per_unit: 7\n  - key: big\n    rate_limit:\n      unit: day\n      requests_per_unit: 1_000\n      shadow_mode: true\n  - key: flag\n    value: \"\"\n    shadow_mode: yes\n    rate_limit:\n      unit: HOUR\n      requests_per_unit: 3\n",
    )
    .unwrap();
    assert_eq!(domain.domain, "42");
    assert_eq!(lookup(&domain, &[("zip", "01234")]).unwrap().0, Some(7));
    assert_eq!(lookup(&domain, &[("zip", "1234")]), None);
    assert_eq!(lookup(&domain, &[("big", "b")]).unwrap().0, Some(1_000));
    let (requests, key) = lookup(&domain, &[("flag", "anything")]).unwrap();
    assert_eq!((requests, key.as_str()), (Some(3), "flag"));
    let flag = domain.lookup(&[("flag".to_owned(), "x".to_owned())]).unwrap();
    assert!(flag.rule.shadow_mode, "yes is true in YAML 1.1");
}

/// TestBasicConfig: the most specific match at the request's depth, key
/// and value before key alone; a value without a rule allows; a rule
/// applies only at its own depth.
#[test]
fn basic_config_matching() {
    let domain = parse(BASIC_CONFIG).unwrap();
    for (entries, expected) in [
        (&[("key1", "something")][..], None),
        (&[("key1", "value1")][..], None),
        (&[("key2", "value2"), ("subkey", "subvalue")][..], None),
        (&[("key5", "value5"), ("subkey5", "subvalue")][..], None),
        (
            &[("key1", "value1"), ("subkey1", "something")][..],
            Some((Some(5), "key1_value1.subkey1")),
        ),
        (
            &[("key1", "value1"), ("subkey1", "subvalue1")][..],
            Some((Some(10), "key1_value1.subkey1_subvalue1")),
        ),
        (&[("key2", "something")][..], Some((Some(20), "key2"))),
        (&[("key2", "value2")][..], Some((Some(30), "key2_value2"))),
        (&[("key2", "value3")][..], None),
        (&[("key3", "foo")][..], Some((Some(1), "key3"))),
        (&[("key4", "foo")][..], Some((Some(1), "key4"))),
        (
            &[("key5", "value5"), ("subkey5", "subvalue5")][..],
            Some((Some(25), "key5_value5.subkey5_subvalue5")),
        ),
        (&[("key6", "foo")][..], Some((None, "key6"))),
        // TestDetailedMetric / README Example 8: the request's value in the key.
        (&[("key7", "unspecified")][..], Some((Some(70), "key7_unspecified"))),
    ] {
        let found = lookup(&domain, entries);
        let expected = expected.map(|(requests, key)| (requests, key.to_owned()));
        assert_eq!(found, expected, "{entries:?}");
    }
    let named = domain.lookup(&[("key4".to_owned(), "x".to_owned())]).unwrap();
    assert_eq!(named.rule.name.as_deref(), Some("key4_rate_limit"));
}

/// TestWildcardConfig / README Example 9: `*` anywhere in a value, any run
/// of characters including none; several `*` in order; no eager match of a
/// plain value; the stat key keeps the pattern.
#[test]
fn wildcards_anywhere_in_a_value() {
    let domain = parse(WILDCARD).unwrap();
    for (entries, expected) in [
        (&[("noVal", "foo1")][..], Some("noVal")),
        (&[("wild", "foo1")][..], Some("wild_foo*")),
        (&[("wild", "foo")][..], Some("wild_foo*")),
        (
            &[("nestedWild", "val1"), ("wild", "goo2")][..],
            Some("nestedWild_val1.wild_goo*"),
        ),
        (&[("wild", "bar")][..], None),
        (&[("noWild", "foo1")][..], None),
        (&[("midWild", "barab")][..], Some("midWild_bar*b")),
        (&[("midWild", "bar123b")][..], Some("midWild_bar*b")),
        (&[("midWild", "barb")][..], Some("midWild_bar*b")),
        (&[("midWild", "bara")][..], None),
        (&[("midWild", "xbarb")][..], None),
        (&[("multiWild", "foo123bar456baz")][..], Some("multiWild_foo*bar*baz")),
        (&[("multiWild", "foobarbaz")][..], Some("multiWild_foo*bar*baz")),
        (&[("multiWild", "foo123baz")][..], None),
        (&[("multiWild", "bar456baz")][..], None),
    ] {
        let found = lookup(&domain, entries).map(|(_, key)| key);
        assert_eq!(found.as_deref(), expected, "{entries:?}");
    }
    // The README's own middle wildcards.
    let readme = parse(
        "domain: example9\ndescriptors:\n  - key: path\n    value: /api/*/action\n    rate_limit:\n      unit: minute\n      requests_per_unit: 20\n  - key: route\n    value: /api/*/resource/*/action\n    rate_limit:\n      unit: minute\n      requests_per_unit: 20\n  - key: ab\n    value: ab*yz\n    rate_limit:\n      unit: minute\n      requests_per_unit: 20\n",
    )
    .unwrap();
    for (entries, matches) in [
        (&[("path", "/api/123/action")][..], true),
        (&[("path", "/api/user-id/action")][..], true),
        (&[("path", "/api/123/other")][..], false),
        (&[("route", "/api/v1/resource/123/action")][..], true),
        (&[("route", "/api/v2/resource/456/action")][..], true),
        (&[("ab", "abyz")][..], true),
        (&[("ab", "ab-middle-yz")][..], true),
        (&[("ab", "abz")][..], false),
    ] {
        assert_eq!(lookup(&readme, entries).is_some(), matches, "{entries:?}");
    }
}

/// TestShareThreshold: stat keys of share_threshold wildcards keep the
/// pattern, nested and with value_to_metric or detailed_metric; an explicit
/// value still wins over the wildcard.
#[test]
fn share_threshold_stat_keys() {
    let domain = parse(SHARE_THRESHOLD).unwrap();
    for (entries, expected) in [
        (&[("files", "files/a.pdf")][..], "files_files/*"),
        (&[("files", "files/b.csv")][..], "files_files/*"),
        (&[("route", "api/v1"), ("method", "GET")][..], "route_api/*.method"),
        (
            &[("service", "svc/users"), ("endpoint", "get")][..],
            "service_svc/*.endpoint_get",
        ),
        (
            &[("nested", "parent"), ("files", "nested/x")][..],
            "nested_parent.files_nested/*",
        ),
        (
            &[("files", "top/x"), ("files", "nested/y")][..],
            "files_top/*.files_nested/*",
        ),
        (
            &[("path", "path/a"), ("file", "file/b"), ("type", "pdf")][..],
            "path_path/*.file_file/*.type",
        ),
        (
            &[("user", "user/1"), ("resource", "res/2"), ("action", "read")][..],
            "user_user/*.resource_res/*.action",
        ),
        (&[("file", "test1")][..], "file_test1"),
        (&[("file", "test2")][..], "file_test*"),
        (&[("midpath", "/api/v1")][..], "midpath_/api*v1"),
        (&[("multiroute", "svcXepYrpc")][..], "multiroute_svc*ep*rpc"),
        (&[("midroute", "/api-beta-v2")][..], "midroute_/api*v2"),
        (
            &[("tenant", "t1prod"), ("resource", "res-v2")][..],
            "tenant_t*prod.resource_res*v2",
        ),
    ] {
        let found = lookup(&domain, entries).map(|(_, key)| key);
        assert_eq!(found.as_deref(), Some(expected), "{entries:?}");
    }
}

/// README Example 10 (TestValueToMetric_*): value_to_metric puts the
/// request's values in the stat key where the config has none, the full
/// value behind a wildcard; detailed_metric takes precedence.
#[test]
fn value_to_metric_stat_keys() {
    let example = parse(
        "domain: example10\ndescriptors:\n  - key: route\n    value_to_metric: true\n    descriptors:\n      - key: http_method\n        value_to_metric: true\n        descriptors:\n          - key: subject_id\n            rate_limit:\n              unit: minute\n              requests_per_unit: 60\n",
    )
    .unwrap();
    let key = |domain: &Domain, entries: &[(&str, &str)]| lookup(domain, entries).unwrap().1;
    assert_eq!(
        key(
            &example,
            &[("route", "api"), ("http_method", "GET"), ("subject_id", "123")]
        ),
        "route_api.http_method_GET.subject_id"
    );
    assert_eq!(
        key(
            &example,
            &[("route", "web"), ("http_method", "POST"), ("subject_id", "456")]
        ),
        "route_web.http_method_POST.subject_id"
    );
    let wildcard = parse(
        "domain: example10_wildcard\ndescriptors:\n  - key: user\n    value_to_metric: true\n    descriptors:\n      - key: action\n        value: read*\n        value_to_metric: true\n        descriptors:\n          - key: resource\n            rate_limit:\n              unit: minute\n              requests_per_unit: 100\n",
    )
    .unwrap();
    assert_eq!(
        key(
            &wildcard,
            &[("user", "alice"), ("action", "readfile"), ("resource", "documents")]
        ),
        "user_alice.action_readfile.resource"
    );
}

// --- Service semantics, over gRPC and /json. ----------------------------------

const MESSAGING: &str = r"domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
";

/// README Example 2: several descriptors in one request, an aggregate result
/// (a logical OR), each status its own; OVER_LIMIT reports limit_remaining 0
/// and duration_until_reset the time to the window's end.
#[tokio::test]
async fn example_2_several_descriptors_and_over_limit_conventions() {
    let server = serve(MESSAGING, Options::default()).await;
    let both = || {
        request(
            "messaging",
            vec![
                descriptor(&[("message_type", "marketing"), ("to_number", "2061111111")]),
                descriptor(&[("to_number", "2061111111")]),
            ],
        )
    };
    for left in (0..5).rev() {
        let response = server.call(both()).await;
        assert_eq!(response.overall_code, OK);
        assert_eq!(
            statuses(&response),
            vec![(OK, left, Some(5)), (OK, left + 95, Some(100))]
        );
    }
    let over = server.call(both()).await;
    assert_eq!(over.overall_code, OVER_LIMIT);
    assert_eq!(over.statuses[0].code, OVER_LIMIT);
    assert_eq!(over.statuses[0].limit_remaining, 0, "OVER_LIMIT reports 0 remaining");
    let reset = over.statuses[0].duration_until_reset.unwrap().seconds as u64;
    let expected = seconds_to_window_end(86_400);
    assert!(reset.abs_diff(expected) <= 1, "{reset} vs {expected}");
    assert_eq!(over.statuses[0].current_limit.as_ref().unwrap().unit, DAY);
    // Another number: its own counters.
    let other = server
        .call(one(
            "messaging",
            &[("message_type", "marketing"), ("to_number", "2062222222")],
        ))
        .await;
    assert_eq!(statuses(&other), vec![(OK, 4, Some(5))]);
}

/// README Example 3: a value with requests_per_unit 0 blocks (OVER_LIMIT,
/// a current limit of 0, the reset at the window's end); other values get
/// the key's limit.
#[tokio::test]
async fn example_3_block_list() {
    let config = "domain: edge_proxy_per_ip\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n\n  # Black list IP\n  - key: remote_address\n    value: 50.0.0.5\n    rate_limit:\n      unit: second\n      requests_per_unit: 0\n";
    let server = serve(config, Options::default()).await;
    let blocked = server
        .call(one("edge_proxy_per_ip", &[("remote_address", "50.0.0.5")]))
        .await;
    assert_eq!(blocked.overall_code, OVER_LIMIT);
    assert_eq!(statuses(&blocked), vec![(OVER_LIMIT, 0, Some(0))]);
    let limit = blocked.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(limit.unit, SECOND);
    assert!(blocked.statuses[0].duration_until_reset.is_some());
    let other = server
        .call(one("edge_proxy_per_ip", &[("remote_address", "50.0.0.1")]))
        .await;
    assert_eq!(other.overall_code, OK);
    assert_eq!(other.statuses[0].current_limit.as_ref().unwrap().requests_per_unit, 10);
}

/// README Example 4: a rule applies only to descriptors exactly as deep as
/// its node; no rule is OK with no current limit and 0 remaining.
#[tokio::test]
async fn example_4_depth_must_match() {
    let shallow = "domain: example4\ndescriptors:\n  - key: key\n    value: value\n    rate_limit:\n      requests_per_unit: 300\n      unit: second\n";
    let server = serve(shallow, Options::default()).await;
    let deeper = server
        .call(one("example4", &[("key", "value"), ("subkey", "subvalue")]))
        .await;
    assert_eq!(statuses(&deeper), vec![(OK, 0, None)]);
    assert_eq!(deeper.statuses[0].duration_until_reset, None);
    let nested = "domain: example4\ndescriptors:\n  - key: key\n    value: value\n    descriptors:\n      - key: subkey\n        rate_limit:\n          requests_per_unit: 300\n          unit: second\n";
    let server = serve(nested, Options::default()).await;
    let deeper = server
        .call(one("example4", &[("key", "value"), ("subkey", "subvalue")]))
        .await;
    assert_eq!(
        deeper.statuses[0].current_limit.as_ref().unwrap().requests_per_unit,
        300
    );
}

/// README Example 5 and TestUnlimited: unlimited is OK with
/// limit_remaining MaxUint32 and no current limit.
#[tokio::test]
async fn example_5_unlimited() {
    let config = "domain: internal\ndescriptors:\n  - key: ldap\n    rate_limit:\n      unlimited: true\n\n  - key: azure\n    rate_limit:\n      unit: minute\n      requests_per_unit: 100\n";
    let server = serve(config, Options::default()).await;
    let response = server
        .call(request(
            "internal",
            vec![
                descriptor(&[("azure", "a")]),
                descriptor(&[("other", "x")]),
                descriptor(&[("ldap", "l")]),
            ],
        ))
        .await;
    assert_eq!(
        statuses(&response),
        vec![(OK, 99, Some(100)), (OK, 0, None), (OK, u32::MAX, None)]
    );
    assert_eq!(response.statuses[2].duration_until_reset, None);
    assert_eq!(response.statuses[0].current_limit.as_ref().unwrap().unit, MINUTE);
}

/// README Example 6 and TestRuleShadowMode / TestMixedRuleShadowMode: a rule
/// in shadow_mode answers OK however far over its limit, and counts the
/// shadowed hits; the other rules still limit.
#[tokio::test]
async fn example_6_rule_shadow_mode() {
    let config = "domain: example6\ndescriptors:\n  - key: service\n    descriptors:\n      - key: user\n        value: user-a\n        rate_limit:\n          requests_per_unit: 10\n          unit: hour\n        shadow_mode: true\n      - key: user\n        value: user-b\n        rate_limit:\n          requests_per_unit: 20\n          unit: hour\n";
    let server = serve(config, Options::default()).await;
    let user = |name: &'static str| one("example6", &[("service", "auth-service"), ("user", name)]);
    for _ in 0..15 {
        let response = server.call(user("user-a")).await;
        assert_eq!(response.overall_code, OK);
        assert_eq!(response.statuses[0].code, OK);
    }
    for _ in 0..20 {
        assert_eq!(server.call(user("user-b")).await.overall_code, OK);
    }
    let mixed = server
        .call(request(
            "example6",
            vec![
                descriptor(&[("service", "auth-service"), ("user", "user-a")]),
                descriptor(&[("service", "auth-service"), ("user", "user-b")]),
            ],
        ))
        .await;
    assert_eq!(mixed.overall_code, OVER_LIMIT);
    assert_eq!((mixed.statuses[0].code, mixed.statuses[1].code), (OK, OVER_LIMIT));
    let metrics = server.metrics().await;
    for line in [
        r#"ratelimit_service_rate_limit_shadow_mode{domain="example6",key1="service",key2="user_user-a"} 6"#,
        r#"ratelimit_service_rate_limit_total_hits{domain="example6",key1="service",key2="user_user-b"} 21"#,
        r#"ratelimit_service_rate_limit_over_limit{domain="example6",key1="service",key2="user_user-b"} 1"#,
    ] {
        assert!(metrics.contains(line), "missing {line} in\n{metrics}");
    }
}

/// README Example 7: a rule that `replaces` another drops it when both
/// match one request; the replaced limit is untouched and applies alone.
#[tokio::test]
async fn example_7_replaces() {
    let config = "domain: example7\ndescriptors:\n  - key: key_1\n    value: value_1\n    descriptors:\n      - key: user\n        value: bkthomps\n        rate_limit:\n          name: specific_limit\n          requests_per_unit: 5\n          unit: hour\n  - key: key_2\n    value: value_2\n    descriptors:\n      - key: user\n        value: bkthomps\n        rate_limit:\n          replaces:\n            - name: specific_limit\n          requests_per_unit: 10\n          unit: hour\n";
    let server = serve(config, Options::default()).await;
    let first = || descriptor(&[("key_1", "value_1"), ("user", "bkthomps")]);
    let second = || descriptor(&[("key_2", "value_2"), ("user", "bkthomps")]);
    for left in (0..10).rev() {
        let response = server.call(request("example7", vec![first(), second()])).await;
        assert_eq!(statuses(&response), vec![(OK, 0, None), (OK, left, Some(10))]);
    }
    let alone = server.call(request("example7", vec![first()])).await;
    assert_eq!(
        statuses(&alone),
        vec![(OK, 4, Some(5))],
        "specific_limit was not affected"
    );
}

/// README Example 8 (detailed_metric) and Example 10 (value_to_metric):
/// the metrics carry the request's values.
#[tokio::test]
async fn examples_8_and_10_metrics_name_the_values() {
    let config = "domain: example8\ndescriptors:\n  - key: key1\n    detailed_metric: true\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: minute\n      requests_per_unit: 20\n";
    let server = serve(config, Options::default()).await;
    for value in ["unspecified_value", "unspecified_value2", "value1"] {
        server.call(one("example8", &[("key1", value)])).await;
    }
    let metrics = server.metrics().await;
    for key in ["key1_unspecified_value", "key1_unspecified_value2", "key1_value1"] {
        let line = format!(r#"ratelimit_service_rate_limit_total_hits{{domain="example8",key1="{key}",key2=""}} 1"#);
        assert!(metrics.contains(&line), "missing {line} in\n{metrics}");
        let ours = format!(r#"tollgate_hits_total{{domain="example8",rule="{key}"}} 1"#);
        assert!(metrics.contains(&ours), "missing {ours} in\n{metrics}");
    }
}

/// README Example 11: with share_threshold every value matching the
/// wildcard shares one counter; without it each has its own.
#[tokio::test]
async fn example_11_share_threshold() {
    let config = "domain: example11\ndescriptors:\n  - key: files\n    value: files/*\n    share_threshold: true\n    rate_limit:\n      unit: hour\n      requests_per_unit: 10\n  - key: files_no_share\n    value: files_no_share/*\n    share_threshold: false\n    rate_limit:\n      unit: hour\n      requests_per_unit: 10\n";
    let server = serve(config, Options::default()).await;
    for file in ["files/a.pdf", "files/b.csv"] {
        for _ in 0..5 {
            assert_eq!(server.call(one("example11", &[("files", file)])).await.overall_code, OK);
        }
    }
    let shared = server.call(one("example11", &[("files", "files/c.txt")])).await;
    assert_eq!(shared.overall_code, OVER_LIMIT, "the shared threshold of 10 is reached");
    for _ in 0..10 {
        let response = server
            .call(one("example11", &[("files_no_share", "files_no_share/a.pdf")]))
            .await;
        assert_eq!(response.overall_code, OK);
    }
    let isolated = server
        .call(one("example11", &[("files_no_share", "files_no_share/b.csv")]))
        .await;
    assert_eq!(isolated.overall_code, OK, "each value has its own threshold");
}

const TWO_LIMITS: &str = "domain: d\ndescriptors:\n  - key: regular\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1\n  - key: quota\n    quota_mode: true\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1\n  - key: quota2\n    quota_mode: true\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1\n";

/// TestServicePerDescriptorQuotaMode, TestServiceMixedPerDescriptorModes,
/// TestServiceQuotaModeOnlySomeOverTheLimit and
/// TestServiceQuotaModeOnlyAllOverTheLimit: a quota_mode descriptor over its
/// limit keeps its own OVER_LIMIT but makes the request OVER_LIMIT only when
/// every quota-mode descriptor is over; a regular one always does.
#[tokio::test]
async fn quota_mode() {
    let server = serve(TWO_LIMITS, Options::default()).await;
    let quota = || descriptor(&[("quota", "q")]);
    let quota2 = || descriptor(&[("quota2", "q")]);
    let regular = || descriptor(&[("regular", "r")]);
    // Use up the quota descriptor alone.
    assert_eq!(server.call(request("d", vec![quota()])).await.overall_code, OK);
    // Only quota over: OVER_LIMIT (every quota descriptor is over).
    let all_over = server.call(request("d", vec![regular(), quota()])).await;
    assert_eq!(all_over.overall_code, OVER_LIMIT);
    assert_eq!((all_over.statuses[0].code, all_over.statuses[1].code), (OK, OVER_LIMIT));
    // One quota descriptor over, another not: OK, and the request consumed
    // from the regular and the admitted quota descriptor.
    let some_over = server.call(request("d", vec![regular(), quota(), quota2()])).await;
    assert_eq!(some_over.overall_code, OK);
    assert_eq!(
        statuses(&some_over),
        vec![(OK, 0, Some(1)), (OVER_LIMIT, 0, Some(1)), (OK, 0, Some(1))]
    );
    // Now the regular one is over: OVER_LIMIT whatever the quota ones say.
    let regular_over = server.call(request("d", vec![regular()])).await;
    assert_eq!(regular_over.overall_code, OVER_LIMIT);
}

/// TestServiceGlobalQuotaMode and TestServiceQuotaModeWithShadowMode: with
/// QUOTA_MODE every rule is in quota mode; with SHADOW_MODE too, the answer
/// is OK and each descriptor keeps its OVER_LIMIT.
#[tokio::test]
async fn global_quota_and_shadow_mode() {
    let config = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1\n  - key: b\n    rate_limit:\n      unit: hour\n      requests_per_unit: 2\n";
    let server = serve(
        config,
        Options {
            all_alternatives: true,
            ..Options::default()
        },
    )
    .await;
    let both = || request("d", vec![descriptor(&[("a", "x")]), descriptor(&[("b", "x")])]);
    assert_eq!(server.call(both()).await.overall_code, OK);
    let some_over = server.call(both()).await;
    assert_eq!(some_over.overall_code, OK, "only a is over");
    assert_eq!(some_over.statuses[0].code, OVER_LIMIT);
    let all_over = server.call(both()).await;
    assert_eq!(all_over.overall_code, OVER_LIMIT);

    let server = serve(
        config,
        Options {
            all_alternatives: true,
            shadow_mode: true,
            ..Options::default()
        },
    )
    .await;
    let single = || request("d", vec![descriptor(&[("a", "x")])]);
    server.call(single()).await;
    let shadowed = server.call(single()).await;
    assert_eq!(shadowed.overall_code, OK);
    assert_eq!(shadowed.statuses[0].code, OVER_LIMIT);
}

/// TestServiceGlobalShadowMode: SHADOW_MODE answers an overall OK and keeps
/// each descriptor's real code; its stat counts the requests it let through.
#[tokio::test]
async fn global_shadow_mode() {
    let config = "domain: different-domain\ndescriptors:\n  - key: foo\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1\n";
    let server = serve(
        config,
        Options {
            shadow_mode: true,
            ..Options::default()
        },
    )
    .await;
    let both = || {
        request(
            "different-domain",
            vec![descriptor(&[("foo", "bar")]), descriptor(&[("hello", "world")])],
        )
    };
    server.call(both()).await;
    let response = server.call(both()).await;
    assert_eq!(response.overall_code, OK);
    assert_eq!(statuses(&response), vec![(OVER_LIMIT, 0, Some(1)), (OK, 0, None)]);
    let (status, json) = server
        .json(&json!({"domain": "different-domain", "descriptors": [{"entries": [{"key": "foo", "value": "bar"}]}]}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(json["overallCode"], "OK");
    assert_eq!(json["statuses"][0]["code"], "OVER_LIMIT");
    let metrics = server.metrics().await;
    assert!(metrics.contains("ratelimit_service_global_shadow_mode 2"), "{metrics}");
}

/// TestServiceWithDefaultRatelimitHeaders / TestServiceWithCustomRatelimitHeaders:
/// LIMIT_RESPONSE_HEADERS_ENABLED adds the limit, remaining and reset of the
/// most restrictive descriptor to response_headers_to_add, under
/// RateLimit-Limit / -Remaining / -Reset or the names configured.
#[tokio::test]
async fn response_headers() {
    let config = "domain: different-domain\ndescriptors:\n  - key: foo\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n  - key: wide\n    rate_limit:\n      unit: hour\n      requests_per_unit: 100\n";
    let headers = |response: &RateLimitResponse| -> Vec<(String, String)> {
        response
            .response_headers_to_add
            .iter()
            .map(|header| (header.key.clone(), header.value.clone()))
            .collect()
    };
    let enabled = Options {
        response_headers: true,
        ..Options::default()
    };
    let server = serve(config, enabled.clone()).await;
    let response = server.call(one("different-domain", &[("foo", "bar")])).await;
    let got = headers(&response);
    assert_eq!(got[0], ("RateLimit-Limit".to_owned(), "10".to_owned()));
    assert_eq!(got[1], ("RateLimit-Remaining".to_owned(), "9".to_owned()));
    let reset: u64 = got[2].1.parse().unwrap();
    assert_eq!(got[2].0, "RateLimit-Reset");
    assert!(reset.abs_diff(seconds_to_window_end(60)) <= 1, "{got:?}");
    // The same in /json's responseHeadersToAdd.
    let (_, json) = server
        .json(&json!({"domain": "different-domain", "descriptors": [{"entries": [{"key": "foo", "value": "bar"}]}]}))
        .await;
    assert_eq!(
        json["responseHeadersToAdd"][1],
        json!({"key": "RateLimit-Remaining", "value": "8"})
    );
    // The most restrictive of two: the denying one; when both deny, the
    // longest retry_after.
    for _ in 0..8 {
        server.call(one("different-domain", &[("foo", "bar")])).await;
    }
    let both = request(
        "different-domain",
        vec![descriptor(&[("wide", "w")]), descriptor(&[("foo", "bar")])],
    );
    let got = headers(&server.call(both).await);
    assert_eq!(got[0].1, "10", "the denying minute limit speaks: {got:?}");
    assert_eq!(got[1].1, "0");

    let custom = Options {
        header_names: HeaderNames {
            limit: "A-Ratelimit-Limit".to_owned(),
            remaining: "A-Ratelimit-Remaining".to_owned(),
            reset: "A-Ratelimit-Reset".to_owned(),
            ..HeaderNames::default()
        },
        ..enabled
    };
    let server = serve(config, custom).await;
    let got = headers(&server.call(one("different-domain", &[("foo", "bar")])).await);
    let names: Vec<&str> = got.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        ["A-Ratelimit-Limit", "A-Ratelimit-Remaining", "A-Ratelimit-Reset"]
    );
}

/// GetHitsAddends: a request's hits_addend 0 counts 1; a descriptor's own
/// hits_addend wins, and 0 there checks without consuming; more than 1
/// consumes that many.
#[tokio::test]
async fn hits_addend_zero_and_more() {
    let config =
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n      requests_per_unit: 10\n";
    let server = serve(config, Options::default()).await;
    let request_of = |hits: u32, own: Option<u64>| {
        let mut each = descriptor(&[("k", "v")]);
        each.hits_addend = own.map(|value| UInt64Value { value });
        let mut request = request("d", vec![each]);
        request.hits_addend = hits;
        request
    };
    assert_eq!(
        statuses(&server.call(request_of(0, None)).await),
        vec![(OK, 9, Some(10))]
    );
    assert_eq!(
        statuses(&server.call(request_of(3, None)).await),
        vec![(OK, 6, Some(10))]
    );
    assert_eq!(
        statuses(&server.call(request_of(3, Some(0))).await),
        vec![(OK, 6, Some(10))]
    );
    assert_eq!(
        statuses(&server.call(request_of(0, Some(6))).await),
        vec![(OK, 0, Some(10))]
    );
    let peek = server.call(request_of(5, Some(0))).await;
    assert_eq!(peek.overall_code, OK, "a check with 0 hits is not over at the limit");
    assert_eq!(server.call(request_of(1, None)).await.overall_code, OVER_LIMIT);
}

/// utils.CalculateReset: a fixed window's duration_until_reset is the time
/// to the window's end, even for a counter nothing has touched (a check
/// with 0 hits on a new key).
#[tokio::test]
async fn untouched_fixed_window_resets_at_the_window_end() {
    let config =
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n      requests_per_unit: 10\n";
    let server = serve(config, Options::default()).await;
    let mut peek = descriptor(&[("k", "fresh")]);
    peek.hits_addend = Some(UInt64Value { value: 0 });
    let response = server.call(request("d", vec![peek])).await;
    let reset = response.statuses[0].duration_until_reset.unwrap();
    let expected = seconds_to_window_end(3_600);
    assert!(reset.seconds > 0, "{reset:?}");
    assert!(
        (reset.seconds as u64).abs_diff(expected) <= 1,
        "{reset:?} vs {expected}"
    );
    assert_eq!(response.statuses[0].current_limit.as_ref().unwrap().unit, HOUR);
}

/// TestConfigLimitOverride: a limit sent by Envoy in the descriptor applies
/// instead of the configuration, as a fixed window of its unit.
#[tokio::test]
async fn limit_override_from_envoy() {
    let server = serve("domain: d\n", Options::default()).await;
    let mut each = descriptor(&[("anything", "x")]);
    each.limit = Some(RateLimitOverride {
        requests_per_unit: 2,
        unit: DAY,
    });
    let response = server.call(request("d", vec![each.clone()])).await;
    assert_eq!(statuses(&response), vec![(OK, 1, Some(2))]);
    assert_eq!(response.statuses[0].current_limit.as_ref().unwrap().unit, DAY);
    server.call(request("d", vec![each.clone()])).await;
    assert_eq!(server.call(request("d", vec![each])).await.overall_code, OVER_LIMIT);
}

/// TestEmptyDomain / TestEmptyDescriptors: refused as invalid, counted as
/// service errors.
#[tokio::test]
async fn empty_domain_or_descriptors_are_refused() {
    let server = serve(MESSAGING, Options::default()).await;
    let status = server.try_call(one("", &[("a", "b")])).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let status = server.try_call(request("messaging", Vec::new())).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let metrics = server.metrics().await;
    assert!(
        metrics.contains(r#"ratelimit_service_should_rate_limit_error{err_type="service_error"} 2"#),
        "{metrics}"
    );
}

/// server/health.go: grpc.health.v1.Health answers SERVING for the server
/// ("") and "ratelimit"; HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED makes it
/// NOT_SERVING (and /healthcheck 500) until a domain is loaded.
#[tokio::test]
async fn grpc_health_and_healthcheck() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    async fn status(server: &Running, service: &str) -> i32 {
        let channel = tonic::transport::Endpoint::from_shared(server.server.grpc_url())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = HealthClient::new(channel);
        let request = HealthCheckRequest {
            service: service.to_owned(),
        };
        client.check(request).await.unwrap().into_inner().status
    }
    async fn healthcheck(server: &Running) -> u16 {
        server.server.get("/healthcheck").await.status().as_u16()
    }

    let server = serve(MESSAGING, Options::default()).await;
    for service in ["", "ratelimit", "envoy.service.ratelimit.v3.RateLimitService"] {
        assert_eq!(
            status(&server, service).await,
            ServingStatus::Serving as i32,
            "{service:?}"
        );
    }
    assert_eq!(healthcheck(&server).await, 200);

    let waiting = serve_files(
        &[],
        Options {
            healthy_with_config_only: true,
            ..Options::default()
        },
    )
    .await;
    // The health service follows the service's state as it starts.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(status(&waiting, "ratelimit").await, ServingStatus::NotServing as i32);
    assert_eq!(healthcheck(&waiting).await, 500);
}

/// TestMetadataReturnedForPassedDescriptors and
/// TestOverlappingMetadataReturnsTheFirstValue (test/config/metadata.yaml):
/// with RESPONSE_DYNAMIC_METADATA the answer carries the request and the
/// `metadata` of the rules whose descriptors passed, the first value winning.
#[tokio::test]
async fn dynamic_metadata_of_the_passed_rules() {
    use envoy_types::pb::google::protobuf::value::Kind;

    let config = "domain: quota-domain\ndescriptors:\n  - key: regular\n    rate_limit:\n      unit: hour\n      requests_per_unit: 10\n    metadata:\n      name: service_1\n      nested: {a: 1}\n  - key: quota\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1\n    metadata:\n      name: service_2\n      nested: {b: 2}\n";
    let server = serve(
        config,
        Options {
            all_alternatives: true,
            dynamic_metadata: true,
            ..Options::default()
        },
    )
    .await;
    let both = || {
        let mut request = request(
            "quota-domain",
            vec![descriptor(&[("regular", "limit")]), descriptor(&[("quota", "limit")])],
        );
        request.hits_addend = 1;
        request
    };
    let text = |value: Option<&envoy_types::pb::google::protobuf::Value>| match value.and_then(|v| v.kind.clone()) {
        Some(Kind::StringValue(text)) => text,
        other => panic!("not text: {other:?}"),
    };
    let nested = |value: Option<&envoy_types::pb::google::protobuf::Value>| match value.and_then(|v| v.kind.clone()) {
        Some(Kind::StructValue(fields)) => fields,
        other => panic!("not a struct: {other:?}"),
    };
    // Both pass: the first descriptor's value wins, structs merge.
    let first = server.call(both()).await;
    let metadata = first.dynamic_metadata.expect("dynamic metadata");
    assert_eq!(text(metadata.fields.get("domain")), "quota-domain");
    let passed = nested(metadata.fields.get("metadata"));
    assert_eq!(text(passed.fields.get("name")), "service_1");
    let merged = nested(passed.fields.get("nested"));
    assert!(
        merged.fields.contains_key("a") && merged.fields.contains_key("b"),
        "{merged:?}"
    );
    // The quota one is over now: only the first one's metadata, overall OK.
    let second = server.call(both()).await;
    assert_eq!(second.overall_code, OK);
    assert_eq!(second.statuses[1].code, OVER_LIMIT);
    let passed = nested(second.dynamic_metadata.unwrap().fields.get("metadata"));
    assert_eq!(text(passed.fields.get("name")), "service_1");
    assert!(!nested(passed.fields.get("nested")).fields.contains_key("b"));
    // The same over /json.
    let (_, json) = server
        .json(&json!({"domain": "quota-domain", "hitsAddend": 1, "descriptors": [{"entries": [{"key": "regular", "value": "limit"}]}]}))
        .await;
    assert_eq!(
        json["dynamicMetadata"]["descriptors"][0]["entries"][0], "regular=limit",
        "{json}"
    );
    assert_eq!(json["dynamicMetadata"]["hitsAddend"], 1, "{json}");
    assert_eq!(json["dynamicMetadata"]["metadata"]["name"], "service_1", "{json}");
}

/// envoyproxy/ratelimit's YAML parser applies merge keys (`<<: *anchor`)
/// and aliases: such files load, with the merged fields.
#[test]
fn yaml_anchors_and_merge_keys() {
    let domain = parse(
        "domain: d\ndefaults: &per_minute\n  unit: minute\n  requests_per_unit: 20\ndescriptors:\n  - key: a\n    rate_limit: *per_minute\n  - key: b\n    rate_limit:\n      <<: *per_minute\n      requests_per_unit: 5\n",
    );
    // `defaults` is not a key of its schema: refused, as there.
    assert!(domain.unwrap_err().to_string().contains("unknown key \"defaults\""));
    let domain = parse(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &per_minute\n      unit: minute\n      requests_per_unit: 20\n  - key: b\n    rate_limit:\n      <<: *per_minute\n      requests_per_unit: 5\n",
    )
    .unwrap();
    assert_eq!(lookup(&domain, &[("a", "x")]).unwrap().0, Some(20));
    assert_eq!(lookup(&domain, &[("b", "x")]).unwrap().0, Some(5));
    let b = domain.lookup(&[("b".to_owned(), "x".to_owned())]).unwrap();
    assert_eq!(b.rule.unit, Some(tollgate_server::config::Unit::Minute));
}
