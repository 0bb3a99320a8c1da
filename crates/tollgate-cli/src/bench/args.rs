//! The arguments of `tollgate bench`, as clap reads them, and their help.

use std::time::Duration;

use tollgate::OnStoreError;

const BENCH_HELP: &str = "\
Each task decides in a loop, as fast as the store answers, taking the keys
bench-0, bench-1, ... in turn (task i starts at key i). With --op acquire a
granted lease is released right away, or after --hold-ms; each request is
then one acquire (whose latency is recorded) and, when granted, its release.

A denial is an answer, not an error: errors count store faults (timeouts,
lost connections). The summary's server_time_start_us / server_time_end_us
are the store's clock (Redis: the server's TIME) just before the first
request and just after the last answer.

Redis: keys are written under --prefix (default tollgate-bench) with the
server's time, and expire by themselves once their state carries no
information. Runs and processes that share a prefix share their limits, so
several bench processes can load one limit together.

Examples:
  tollgate bench --duration 10s --tasks 4 --keys 1000
  tollgate bench --store redis://127.0.0.1:6379 --tasks 64 --json --quiet \\
      --limit '{\"algorithm\":\"gcra\",\"rate\":100,\"period\":\"1s\",\"burst\":20}'
  tollgate bench --store redis://127.0.0.1:6379 --op acquire --hold-ms 50 \\
      --limit '{\"algorithm\":\"concurrency\",\"limit\":5,\"ttl\":\"10s\"}'

A running server (--target): each of --connections connections (a gRPC
channel, or an HTTP/1.1 keep-alive connection) keeps one request in flight.
gRPC sends Envoy's ShouldRateLimit; HTTP sends --request: `json` (POST /json,
Envoy's request in protobuf's JSON mapping), `check` (POST /v1/check,
Tollgate's body) or `healthz` (GET /healthz, no decision: the server's floor).
Each --descriptor is one descriptor, its entries key=value separated by
commas; with --keys K the value of each descriptor's last entry gets the
suffix -0 ... -(K-1), taken in turn (connection i starts at i). OVER_LIMIT
(429) is an answer; errors are transport failures and any other status.
Every connection sends one request before the clock starts (a warm-up, not
counted); the summary says whether a limit applied to the first one: a
request no rule matches is answered without deciding anything.

  tollgate bench --target grpc://127.0.0.1:8081 --connections 64 --duration 5s \\
      --domain bench --descriptor client=c --keys 1000
  tollgate bench --target http://127.0.0.1:8080 --request json --connections 64 \\
      --domain bench --descriptor client=c --keys 1000 --json";

/// Arguments of `tollgate bench`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = BENCH_HELP)]
#[allow(clippy::struct_excessive_bools)] // Each is one command-line switch.
pub struct Args {
    /// Where limit state lives: "memory" (embedded) or a Redis URL
    /// (redis://[user:password@]host[:port][/db], rediss:// for TLS,
    /// redis+cluster://host:port[,host:port...] for a Cluster,
    /// redis+sentinel://host:port[,host:port...]/<master name> behind Sentinels)
    #[arg(long, value_name = "URL", default_value = "memory")]
    pub(super) store: String,
    /// Load a running `tollgate serve` instead of a store:
    /// grpc://HOST:PORT (Envoy's ShouldRateLimit) or http://HOST:PORT (see
    /// --request)
    #[arg(long, value_name = "URL", conflicts_with_all = ["store", "limit", "tasks", "op", "hold_ms", "prefix", "batch"])]
    pub(super) target: Option<String>,
    /// The limit or policy as JSON, as for simulate [default: GCRA at 1e9 per
    /// second, burst 1e9: nearly everything is allowed]
    #[arg(long, value_name = "JSON")]
    pub(super) limit: Option<String>,
    /// Concurrent tasks sharing the one store (and its one connection); at
    /// most 10 000 (each keeps a latency histogram of about 200 KiB)
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(super) tasks: u32,
    /// Threads running the tasks [default: one per core]; with a server on
    /// the same machine, 1 leaves it the other cores (redis-benchmark runs
    /// on one thread)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub(super) threads: Option<u16>,
    /// With --target: concurrent connections, each with one request in
    /// flight; at most 10 000
    #[arg(long, value_name = "N", requires = "target", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(super) connections: u32,
    /// Send at this steady rate (requests per second over all connections,
    /// or against a store over all tasks, each pacing its share) instead of
    /// as fast as answers come; latency is measured from each send
    #[arg(long, value_name = "PER_SECOND", value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub(super) rate: Option<u64>,
    /// With an http:// target: what each request is [default: check]
    #[arg(long, value_enum, value_name = "KIND", requires = "target")]
    pub(super) request: Option<HttpRequest>,
    /// With --target: the domain of the requests
    #[arg(long, value_name = "DOMAIN", requires = "target")]
    pub(super) domain: Option<String>,
    /// With --target: one descriptor, as key=value[,key=value...]; repeat for
    /// several descriptors
    #[arg(long = "descriptor", value_name = "ENTRIES", requires = "target")]
    pub(super) descriptors: Vec<String>,
    /// How long to run, e.g. 5s or 500ms [default: 5s]
    #[arg(long, value_name = "DURATION", value_parser = crate::arg::duration, conflicts_with = "requests")]
    pub(super) duration: Option<Duration>,
    /// Stop after this many requests instead of after a duration
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) requests: Option<u64>,
    /// Distinct subjects (with --target: descriptor values), taken by the
    /// tasks in turn; at most 10 000 000 [default: 1]
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub(super) keys: Option<u64>,
    /// What each request does
    #[arg(long, value_enum, default_value_t = BenchOp::Check)]
    pub(super) op: BenchOp,
    /// With --op acquire: hold each granted lease this many milliseconds
    /// before releasing it
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub(super) hold_ms: u64,
    /// Units each request weighs (with --target: its hits_addend)
    #[arg(long, value_name = "UNITS", default_value_t = 1)]
    pub(super) cost: u64,
    /// Store runs: each request weighs a number of units drawn evenly from
    /// --cost to this (token usage that varies)
    #[arg(long, value_name = "UNITS", conflicts_with = "target")]
    pub(super) cost_max: Option<u64>,
    /// Redis: the prefix of every key [default: tollgate-bench]
    #[arg(long, value_name = "PREFIX")]
    pub(super) prefix: Option<String>,
    /// Redis: the most decisions sent in one call (decisions started while a
    /// call is under way go together in the next); 1 sends each in a call
    /// of its own [default: 64]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(super) batch: Option<u32>,
    /// Redis: what a decision is when Redis fails (error, open, closed,
    /// local); with it the store gets a deadline and a circuit breaker, and
    /// the summary counts decisions by path
    #[arg(long, value_name = "POLICY", value_parser = crate::arg::on_store_error)]
    pub(super) on_store_error: Option<OnStoreError>,
    /// Redis, with --on-store-error: the deadline of each call [default: 100ms]
    #[arg(long, value_name = "DURATION", value_parser = crate::arg::duration, requires = "on_store_error")]
    pub(super) store_timeout: Option<Duration>,
    /// Redis, with --on-store-error: denials remembered and answered again
    /// until their retry_after, one per subject (0: off) [default: 0]
    #[arg(long, value_name = "ENTRIES", requires = "on_store_error")]
    pub(super) deny_cache: Option<usize>,
    /// Print the summary as one JSON object on stdout
    #[arg(long)]
    pub(super) json: bool,
    /// No progress bar (it is hidden anyway when stderr is not a terminal)
    #[arg(long, short)]
    pub(super) quiet: bool,
}

/// What each request to an http:// target is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HttpRequest {
    /// POST /json: Envoy's request in protobuf's JSON mapping
    Json,
    /// POST /v1/check: Tollgate's own body
    Check,
    /// GET /healthz: no decision, the server's floor
    Healthz,
}

/// What each request of the run does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchOp {
    /// Decide and consume when allowed
    Check,
    /// Count the cost as spent already, whether or not it fits
    Record,
    /// A gateway's token budget: a check of 0, and when it passes a record
    /// of the cost (two store calls)
    CheckThenRecord,
    /// Estimate then settle: take the cost as an estimate, then settle half
    /// of it (two store calls: a check and a refund)
    Settle,
    /// Take a lease on the concurrency limits and release it right away
    /// (or after --hold-ms)
    Acquire,
}

impl BenchOp {
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Check => "check",
            Self::Record => "record",
            Self::CheckThenRecord => "check-then-record",
            Self::Settle => "settle",
            Self::Acquire => "acquire",
        }
    }
}
