//! `tollgate bench --target`: load against a running `tollgate serve`, over
//! Envoy's gRPC protocol or HTTP.
//!
//! Each of `--connections` tasks owns one connection — a tonic `Channel`
//! (its own HTTP/2 connection) or a reqwest client holding one HTTP/1.1
//! keep-alive connection — and keeps one request in flight: send, wait for
//! the answer, record the latency, send the next. The server thus sees
//! exactly N concurrent requests, as from N proxies that each wait for their
//! answer. The requests are built as they are sent (a clone and one number
//! formatted), so `--keys` costs no memory up front.
//!
//! Before the clock starts every connection is opened and sends one request
//! of the run, its warm-up: a server that cannot be reached or refuses the
//! request fails the run at once, and the first warm-up answer tells whether
//! a limit applied to the descriptors at all (a request no rule matches is
//! answered without a store call, which would measure nothing). Warm-ups are
//! not in the figures; the summary counts them for those comparing with the
//! store's own counters.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use indicatif::ProgressBar;
use serde_json::{json, Value};
use tonic::transport::{Channel, Endpoint};

use super::report::{Report, TargetRun};
use super::{join_workers, show_progress, Args, Deadline, HttpRequest, Shared, Tally, Until};
use crate::UsageError;

/// How long one request (or opening a connection) may take before it counts
/// as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Stands for the key's number in a request body template; JSON escapes it
/// as `\u0000`, which no descriptor written on a command line contains.
const KEY_MARK: &str = "\u{0}";

/// What the connections speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Grpc,
    Http(HttpRequest),
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Self::Grpc => "ShouldRateLimit",
            Self::Http(HttpRequest::Json) => "POST /json",
            Self::Http(HttpRequest::Check) => "POST /v1/check",
            Self::Http(HttpRequest::Healthz) => "GET /healthz",
        }
    }
}

/// A validated run against a server.
#[derive(Debug)]
pub(super) struct Plan {
    /// The URL as given, for the summary.
    target: String,
    /// `host:port`.
    authority: String,
    protocol: Protocol,
    connections: u32,
    keys: u64,
    until: Until,
    requests: Requests,
    /// With `--rate`: the time between two sends of one connection.
    pace: Option<Duration>,
}

/// Reads `grpc://HOST:PORT` or `http://HOST:PORT` into the protocol's scheme
/// and `HOST:PORT`.
fn parse_target(url: &str) -> Result<(&str, &str), UsageError> {
    let expected = "expected grpc://HOST:PORT or http://HOST:PORT";
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(UsageError(format!("--target \"{url}\": {expected}")));
    };
    if !matches!(scheme, "grpc" | "http") {
        return Err(UsageError(format!(
            "--target: unknown scheme \"{scheme}://\" ({expected}; TLS is not supported)"
        )));
    }
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
        return Err(UsageError(format!("--target \"{url}\": {expected}, without a path")));
    }
    Ok((scheme, authority))
}

/// Reads one `--descriptor`: `key=value[,key=value...]`.
fn parse_descriptor(text: &str) -> Result<Vec<(String, String)>, UsageError> {
    text.split(',')
        .map(|entry| match entry.split_once('=') {
            Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
            _ => Err(UsageError(format!(
                "--descriptor \"{text}\": each entry must be key=value (a key is required)"
            ))),
        })
        .collect()
}

impl Plan {
    pub(super) fn new(args: &Args, url: &str) -> Result<Self, UsageError> {
        let (scheme, authority) = parse_target(url)?;
        let protocol = match (scheme, args.request) {
            ("grpc", None) => Protocol::Grpc,
            ("grpc", Some(_)) => {
                return Err(UsageError(
                    "--request applies only to an http:// target (gRPC sends ShouldRateLimit)".to_owned(),
                ))
            }
            (_, request) => Protocol::Http(request.unwrap_or(HttpRequest::Check)),
        };
        let decides = protocol != Protocol::Http(HttpRequest::Healthz);
        let requests = if decides {
            let domain = args
                .domain
                .clone()
                .filter(|domain| !domain.is_empty())
                .ok_or_else(|| UsageError(format!("--target with {}: --domain is required", protocol.name())))?;
            if args.descriptors.is_empty() {
                return Err(UsageError(format!(
                    "--target with {}: at least one --descriptor is required",
                    protocol.name()
                )));
            }
            let descriptors = args
                .descriptors
                .iter()
                .map(|text| parse_descriptor(text))
                .collect::<Result<Vec<_>, _>>()?;
            if protocol == Protocol::Grpc && u32::try_from(args.cost).is_err() {
                return Err(UsageError(format!("--cost must be at most {} over gRPC", u32::MAX)));
            }
            Requests::new(domain, descriptors, args.keys.is_some(), args.cost)
        } else {
            if args.domain.is_some() || !args.descriptors.is_empty() || args.keys.is_some() || args.cost != 1 {
                return Err(UsageError(
                    "--request healthz decides nothing: --domain, --descriptor, --keys and --cost do not apply"
                        .to_owned(),
                ));
            }
            Requests::new(String::new(), Vec::new(), false, 1)
        };
        Ok(Self {
            target: url.to_owned(),
            authority: authority.to_owned(),
            protocol,
            connections: args.connections,
            keys: args.keys.unwrap_or(1),
            until: Until::new(args),
            requests,
            pace: args
                .rate
                .map(|rate| Duration::from_secs_f64(f64::from(args.connections) / rate as f64)),
        })
    }
}

/// The request of each key, from `--domain`, `--descriptor`, `--keys` and
/// `--cost`.
#[derive(Debug)]
struct Requests {
    /// The gRPC request with the descriptors' values as given.
    grpc: RateLimitRequest,
    /// Append `-<key>` to the value of each descriptor's last entry.
    vary: bool,
    /// The values to vary, as given.
    last_values: Vec<String>,
    /// The body of POST /v1/check, cut where the key's suffix goes.
    check_body: Vec<String>,
    /// The body of POST /json, cut where the key's suffix goes.
    json_body: Vec<String>,
}

impl Requests {
    fn new(domain: String, descriptors: Vec<Vec<(String, String)>>, vary: bool, cost: u64) -> Self {
        let last_values = descriptors
            .iter()
            .map(|entries| entries.last().map(|(_, value)| value.clone()).unwrap_or_default())
            .collect();
        // The JSON bodies, with a mark where each varying value ends.
        let entries_json = |entries: &[(String, String)]| -> Value {
            let last = entries.len().saturating_sub(1);
            let entries: Vec<Value> = entries
                .iter()
                .enumerate()
                .map(|(index, (key, value))| {
                    let value = if vary && index == last {
                        format!("{value}{KEY_MARK}")
                    } else {
                        value.clone()
                    };
                    json!({ "key": key, "value": value })
                })
                .collect();
            json!({ "entries": entries })
        };
        let descriptors_json: Vec<Value> = descriptors.iter().map(|entries| entries_json(entries)).collect();
        let mut check = json!({ "domain": domain, "descriptors": descriptors_json });
        let mut envoy = check.clone();
        if cost != 1 {
            check["cost"] = json!(cost);
            envoy["hitsAddend"] = json!(cost);
        }
        let mark = serde_json::to_string(KEY_MARK).expect("a string serializes");
        let mark = mark.trim_matches('"');
        let cut = |body: &Value| -> Vec<String> { body.to_string().split(mark).map(str::to_owned).collect() };
        let grpc = RateLimitRequest {
            domain,
            descriptors: descriptors
                .into_iter()
                .map(|entries| RateLimitDescriptor {
                    entries: entries.into_iter().map(|(key, value)| Entry { key, value }).collect(),
                    ..RateLimitDescriptor::default()
                })
                .collect(),
            hits_addend: if cost == 1 {
                0
            } else {
                u32::try_from(cost).unwrap_or(u32::MAX)
            },
        };
        Self {
            grpc,
            vary,
            last_values,
            check_body: cut(&check),
            json_body: cut(&envoy),
        }
    }

    fn grpc(&self, key: u64) -> RateLimitRequest {
        let mut request = self.grpc.clone();
        if self.vary {
            for (descriptor, value) in request.descriptors.iter_mut().zip(&self.last_values) {
                if let Some(entry) = descriptor.entries.last_mut() {
                    entry.value = format!("{value}-{key}");
                }
            }
        }
        request
    }

    fn body(&self, request: HttpRequest, key: u64) -> String {
        let parts = match request {
            HttpRequest::Check => &self.check_body,
            HttpRequest::Json => &self.json_body,
            HttpRequest::Healthz => return String::new(),
        };
        parts.join(&format!("-{key}"))
    }
}

/// The server's answer to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Ok,
    OverLimit,
}

/// One connection to the server.
enum Connection {
    Grpc(RateLimitServiceClient<Channel>),
    Http {
        client: reqwest::Client,
        url: reqwest::Url,
        request: HttpRequest,
    },
}

impl Connection {
    async fn open(plan: &Plan) -> anyhow::Result<Self> {
        match plan.protocol {
            Protocol::Grpc => {
                let endpoint = Endpoint::from_shared(format!("http://{}", plan.authority))
                    .map_err(|error| UsageError(format!("--target {}: {error}", plan.target)))?
                    .tcp_nodelay(true)
                    .connect_timeout(REQUEST_TIMEOUT);
                let channel = endpoint
                    .connect()
                    .await
                    .map_err(|error| anyhow::anyhow!("cannot connect: {}", chain(&error)))?;
                Ok(Self::Grpc(RateLimitServiceClient::new(channel)))
            }
            Protocol::Http(request) => {
                let path = match request {
                    HttpRequest::Json => "/json",
                    HttpRequest::Check => "/v1/check",
                    HttpRequest::Healthz => "/healthz",
                };
                let url = reqwest::Url::parse(&format!("http://{}{path}", plan.authority))
                    .map_err(|error| UsageError(format!("--target {}: {error}", plan.target)))?;
                // One idle connection kept: one task, one request at a time,
                // so the same keep-alive connection serves every request.
                let client = reqwest::Client::builder()
                    .http1_only()
                    .pool_max_idle_per_host(1)
                    .tcp_nodelay(true)
                    .no_proxy()
                    .connect_timeout(REQUEST_TIMEOUT)
                    .build()
                    .context("cannot build the HTTP client")?;
                Ok(Self::Http { client, url, request })
            }
        }
    }

    /// Sends the request of `key`. With `inspect`, also says whether a limit
    /// applied to it (`None` for a request that decides nothing).
    async fn send(&mut self, requests: &Requests, key: u64, inspect: bool) -> Result<(Answer, Option<bool>), String> {
        match tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(requests, key, inspect)).await {
            Ok(answer) => answer,
            Err(_) => Err(format!("no answer within {REQUEST_TIMEOUT:?}")),
        }
    }

    async fn exchange(
        &mut self,
        requests: &Requests,
        key: u64,
        inspect: bool,
    ) -> Result<(Answer, Option<bool>), String> {
        match self {
            Self::Grpc(client) => {
                let response = client
                    .should_rate_limit(requests.grpc(key))
                    .await
                    .map_err(|status| format!("gRPC {:?}: {}", status.code(), status.message()))?
                    .into_inner();
                let answer = match response.overall_code {
                    1 => Answer::Ok,
                    2 => Answer::OverLimit,
                    code => return Err(format!("gRPC answer with overall_code {code}")),
                };
                let applied = response.statuses.iter().any(|status| status.current_limit.is_some());
                Ok((answer, Some(applied)))
            }
            Self::Http { client, url, request } => {
                let builder = match request {
                    HttpRequest::Healthz => client.get(url.clone()),
                    HttpRequest::Json | HttpRequest::Check => client
                        .post(url.clone())
                        .header(reqwest::header::CONTENT_TYPE, "application/json")
                        .body(requests.body(*request, key)),
                };
                let response = builder
                    .send()
                    .await
                    .map_err(|error| format!("HTTP: {}", chain(&error)))?;
                let status = response.status();
                // Read to the end, so the connection serves the next request.
                let body = response
                    .bytes()
                    .await
                    .map_err(|error| format!("HTTP: {}", chain(&error)))?;
                let answer = match status.as_u16() {
                    200 => Answer::Ok,
                    429 if *request != HttpRequest::Healthz => Answer::OverLimit,
                    _ => {
                        let text = String::from_utf8_lossy(&body);
                        let text: String = text.trim().chars().take(200).collect();
                        return Err(format!("HTTP {status}: {text}"));
                    }
                };
                let applied = match request {
                    HttpRequest::Healthz => None,
                    _ if !inspect => Some(true),
                    HttpRequest::Json => Some(limit_applied(&body, "statuses", "currentLimit")),
                    // A descriptor decided by a limit carries the decision's fields.
                    HttpRequest::Check => Some(limit_applied(&body, "descriptors", "allowed")),
                };
                Ok((answer, applied))
            }
        }
    }
}

/// `error` and its sources, as "error: source: source".
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let message = cause.to_string();
        // Some errors repeat their source in their own message.
        if !text.ends_with(&message) {
            text = format!("{text}: {message}");
        }
        source = cause.source();
    }
    text
}

/// Whether any element of the array `list` of the JSON `body` has `field`.
fn limit_applied(body: &[u8], list: &str, field: &str) -> bool {
    serde_json::from_slice::<Value>(body).ok().is_some_and(|body| {
        body[list]
            .as_array()
            .is_some_and(|items| items.iter().any(|item| item.get(field).is_some()))
    })
}

/// Opens every connection and sends its warm-up request; returns the
/// connections and whether a limit applied to the first warm-up.
async fn open_all(plan: &Arc<Plan>) -> anyhow::Result<(Vec<Connection>, Option<bool>)> {
    let mut opening = tokio::task::JoinSet::new();
    for index in 0..plan.connections {
        let plan = Arc::clone(plan);
        opening.spawn(async move {
            let mut connection = Connection::open(&plan).await?;
            let key = u64::from(index) % plan.keys;
            let (_, applied) = connection
                .send(&plan.requests, key, index == 0)
                .await
                .map_err(|error| anyhow::anyhow!("the warm-up request failed: {error}"))?;
            anyhow::Ok((index, connection, applied))
        });
    }
    let mut connections = Vec::with_capacity(opening.len());
    let mut first_applied = None;
    while let Some(opened) = opening.join_next().await {
        let (index, connection, applied) = opened
            .context("a connection task panicked")?
            .with_context(|| format!("cannot use the server at {}", plan.target))?;
        if index == 0 {
            first_applied = applied;
        }
        connections.push((index, connection));
    }
    connections.sort_by_key(|(index, _)| *index);
    Ok((
        connections.into_iter().map(|(_, connection)| connection).collect(),
        first_applied,
    ))
}

/// Runs the load against the server of `plan`.
pub(super) async fn bench(plan: Plan, progress: &ProgressBar) -> anyhow::Result<Report> {
    // Shared with the tasks that open the connections.
    let plan = Arc::new(plan);
    let (connections, limit_applied) = open_all(&plan).await?;
    let shared = Arc::new(Shared::default());
    show_progress(progress, plan.until);

    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (index, connection) in (0_u32..).zip(connections) {
        // Paced connections start spread over one pace, not all at once.
        let first_send = plan
            .pace
            .map_or(started, |pace| started + pace * index / plan.connections);
        let worker = Worker {
            first_send,
            connection,
            plan: Arc::clone(&plan),
            shared: Arc::clone(&shared),
            until: plan.until.deadline(started),
        };
        tasks.spawn(worker.run());
    }
    let tallies = join_workers(tasks, progress, &shared, plan.until, started).await?;
    let elapsed = started.elapsed();

    let run = TargetRun {
        target: plan.target.clone(),
        request: plan.protocol.name(),
        connections: plan.connections,
        keys: plan.keys,
        warmup_requests: u64::from(plan.connections),
        limit_applied,
        domain: plan.requests.grpc.domain.clone(),
    };
    Ok(Report::target(run, tallies, elapsed))
}

/// One connection of the run.
struct Worker {
    connection: Connection,
    plan: Arc<Plan>,
    shared: Arc<Shared>,
    until: Deadline,
    /// With `--rate`, when the first request goes (then one each pace).
    first_send: Instant,
}

impl Worker {
    async fn run(mut self) -> Tally {
        let mut tally = Tally::new();
        let mut next_send = self.first_send;
        while !self.until.reached(&self.shared) {
            if let Some(pace) = self.plan.pace {
                // Behind schedule (a slow answer), the next sends go at once
                // until the connection has caught up.
                tokio::time::sleep_until(next_send.into()).await;
                next_send += pace;
            }
            // The connections take the keys in turn between them.
            let key = self.shared.next_key.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % self.plan.keys;
            let sent = Instant::now();
            let result = self.connection.send(&self.plan.requests, key, false).await;
            let latency = u64::try_from(sent.elapsed().as_nanos()).unwrap_or(u64::MAX);
            tally.latency.saturating_record(latency);
            self.shared.answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            match result {
                Ok((Answer::Ok, _)) => tally.allowed += 1,
                Ok((Answer::OverLimit, _)) => tally.denied += 1,
                Err(error) => {
                    tally.errors += 1;
                    tally.first_error.get_or_insert(error);
                }
            }
        }
        tally
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_name_a_protocol_and_an_address() {
        assert_eq!(
            parse_target("grpc://127.0.0.1:8081").unwrap(),
            ("grpc", "127.0.0.1:8081")
        );
        assert_eq!(parse_target("http://localhost:80/").unwrap(), ("http", "localhost:80"));
        assert!(parse_target("https://h:1")
            .unwrap_err()
            .0
            .contains("TLS is not supported"));
        assert!(parse_target("http://h:1/json")
            .unwrap_err()
            .0
            .contains("without a path"));
        assert!(parse_target("127.0.0.1:8080").is_err());
    }

    #[test]
    fn descriptors_are_entries_separated_by_commas() {
        assert_eq!(
            parse_descriptor("a=1,b=").unwrap(),
            [("a".to_owned(), "1".to_owned()), ("b".to_owned(), String::new())]
        );
        assert!(parse_descriptor("a").is_err());
        assert!(parse_descriptor("=1").is_err());
    }

    #[test]
    fn keys_vary_the_last_value_of_each_descriptor() {
        let descriptors = vec![
            vec![("k".to_owned(), "v".to_owned()), ("p".to_owned(), "x\"y".to_owned())],
            vec![("c".to_owned(), "z".to_owned())],
        ];
        let requests = Requests::new("d".to_owned(), descriptors.clone(), true, 3);
        assert_eq!(
            requests.body(HttpRequest::Check, 7),
            r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"},{"key":"p","value":"x\"y-7"}]},{"entries":[{"key":"c","value":"z-7"}]}],"cost":3}"#
        );
        let json: Value = serde_json::from_str(&requests.body(HttpRequest::Json, 12)).unwrap();
        assert_eq!(json["hitsAddend"], 3);
        assert_eq!(json["descriptors"][1]["entries"][0]["value"], "z-12");
        let grpc = requests.grpc(5);
        assert_eq!(grpc.hits_addend, 3);
        assert_eq!(grpc.descriptors[0].entries[0].value, "v");
        assert_eq!(grpc.descriptors[0].entries[1].value, "x\"y-5");
        assert_eq!(grpc.descriptors[1].entries[0].value, "z-5");

        // Without --keys the values are sent as given.
        let requests = Requests::new("d".to_owned(), descriptors, false, 1);
        assert_eq!(
            requests.body(HttpRequest::Json, 4),
            r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"},{"key":"p","value":"x\"y"}]},{"entries":[{"key":"c","value":"z"}]}]}"#
        );
        assert_eq!(requests.grpc(4).descriptors[1].entries[0].value, "z");
        assert_eq!(requests.grpc(4).hits_addend, 0);
    }
}
