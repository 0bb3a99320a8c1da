//! The summary of a run: counts, throughput, latency percentiles and, for a
//! store, its clock at both ends; for a server, the warm-up. As one JSON
//! object or as text for people.

use std::fmt::Write as _;
use std::time::Duration;

use tollgate::Path;

use super::{histogram, Plan, Tally};

/// What was loaded, and what only that kind of run reports.
#[derive(Debug)]
enum Kind {
    Store {
        store: String,
        op: &'static str,
        tasks: u32,
        server_time_start_us: u64,
        server_time_end_us: u64,
    },
    Target {
        target: String,
        request: &'static str,
        connections: u32,
        warmup_requests: u64,
        /// Whether a limit applied to the first warm-up request (`None`:
        /// the request decides nothing, as `/healthz`).
        limit_applied: Option<bool>,
        /// The domain, for the warning when no limit applied.
        domain: String,
    },
}

/// The figures of a finished run.
#[derive(Debug)]
pub struct Report {
    kind: Kind,
    keys: u64,
    pub requests: u64,
    /// Allowed (a server's OK).
    allowed: u64,
    /// Store runs: the units the store counted.
    units: u64,
    /// Denied (a server's OVER_LIMIT).
    denied: u64,
    pub errors: u64,
    /// The first fault met, if any.
    first_error: Option<String>,
    elapsed: Duration,
    p50_ns: u64,
    p99_ns: u64,
    p999_ns: u64,
    max_ns: u64,
    /// With a failure policy: decisions by path (as `Path::ALL`), the p99 of
    /// those the store did not decide, and when the store decided again
    /// after a fault (ms since the Unix epoch; the earliest of the tasks'
    /// last recoveries).
    resilience: Option<Resilience>,
    /// Against Redis: the engine that decided (`module` or `lua`).
    engine: Option<&'static str>,
    /// The process's CPU time over the run (user and system).
    cpu: Option<Duration>,
    /// Against a store: the calls made to it (`None`: one per decision, no
    /// lease).
    store_calls: Option<u64>,
}

#[derive(Debug)]
struct Resilience {
    paths: [u64; Path::ALL.len()],
    fallback_p99_ns: u64,
    recovered_at_ms: Option<u64>,
}

/// `ns` in microseconds, to the nanosecond.
fn micros(ns: u64) -> f64 {
    ns as f64 / 1_000.0
}

fn plural(count: u64, word: &str) -> String {
    if count == 1 {
        format!("{count} {word}")
    } else {
        format!("{count} {word}s")
    }
}

/// What a server run reports beyond the tallies.
pub(super) struct TargetRun {
    pub target: String,
    pub request: &'static str,
    pub connections: u32,
    pub keys: u64,
    pub warmup_requests: u64,
    pub limit_applied: Option<bool>,
    pub domain: String,
}

/// This process's CPU time so far (user and system, from `/proc/self/stat`,
/// in the kernel's 10 ms ticks); `None` where there is no `/proc`.
pub(super) fn process_cpu() -> Option<Duration> {
    /// `USER_HZ`, fixed at 100 by the Linux ABI.
    const TICKS_PER_SECOND: u64 = 100;
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces): state is the
    // first, utime the 12th, stime the 13th.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis((user + system) * 1000 / TICKS_PER_SECOND))
}

impl Report {
    /// Adds the engine that decided and the process's CPU time over the run.
    pub(super) fn with_process(mut self, engine: Option<&'static str>, cpu: Option<Duration>) -> Self {
        self.engine = engine;
        self.cpu = cpu;
        self
    }

    /// Adds the calls made to the store, when leases made them fewer than
    /// the decisions.
    pub(super) fn with_store_calls(mut self, calls: Option<u64>) -> Self {
        self.store_calls = calls;
        self
    }

    /// Calls made to the store: with leases as counted, else one per decision.
    fn store_calls(&self) -> u64 {
        self.store_calls.unwrap_or(self.allowed + self.denied)
    }

    /// Store calls per decision.
    fn store_calls_per_decision(&self) -> f64 {
        self.store_calls() as f64 / (self.allowed + self.denied).max(1) as f64
    }

    /// The process's CPU per decision, µs.
    fn cpu_us_per_decision(&self) -> Option<f64> {
        let decisions = self.allowed + self.denied;
        self.cpu
            .filter(|_| decisions > 0)
            .map(|cpu| cpu.as_secs_f64() * 1e6 / decisions as f64)
    }

    /// Adds up the tasks' tallies of a run against a store.
    pub(super) fn store(
        plan: &Plan,
        tallies: Vec<Tally>,
        elapsed: Duration,
        server_time_start_us: u64,
        server_time_end_us: u64,
    ) -> Self {
        let kind = Kind::Store {
            store: plan.store.display(),
            op: plan.op.name(),
            tasks: plan.tasks,
            server_time_start_us,
            server_time_end_us,
        };
        let resilience = plan.on_store_error.map(|_| {
            let mut fallback = histogram();
            let mut paths = [0; Path::ALL.len()];
            for tally in &tallies {
                let _ = fallback.add(&tally.fallback_latency);
                for (sum, count) in paths.iter_mut().zip(tally.paths) {
                    *sum += count;
                }
            }
            Resilience {
                paths,
                fallback_p99_ns: if fallback.is_empty() {
                    0
                } else {
                    fallback.value_at_quantile(0.99)
                },
                recovered_at_ms: tallies.iter().filter_map(|tally| tally.recovered_at_ms).min(),
            }
        });
        let mut report = Self::new(kind, plan.keys, tallies, elapsed);
        report.resilience = resilience;
        report
    }

    /// Adds up the connections' tallies of a run against a server.
    pub(super) fn target(run: TargetRun, tallies: Vec<Tally>, elapsed: Duration) -> Self {
        let kind = Kind::Target {
            target: run.target,
            request: run.request,
            connections: run.connections,
            warmup_requests: run.warmup_requests,
            limit_applied: run.limit_applied,
            domain: run.domain,
        };
        Self::new(kind, run.keys, tallies, elapsed)
    }

    fn new(kind: Kind, keys: u64, tallies: Vec<Tally>, elapsed: Duration) -> Self {
        let mut latency = histogram();
        let mut report = Self {
            kind,
            keys,
            requests: 0,
            allowed: 0,
            units: 0,
            denied: 0,
            errors: 0,
            first_error: None,
            elapsed,
            p50_ns: 0,
            p99_ns: 0,
            p999_ns: 0,
            max_ns: 0,
            resilience: None,
            engine: None,
            store_calls: None,
            cpu: None,
        };
        for tally in tallies {
            report.allowed += tally.allowed;
            report.units += tally.units;
            report.denied += tally.denied;
            report.errors += tally.errors;
            if report.first_error.is_none() {
                report.first_error = tally.first_error;
            }
            // Same bounds on both sides: adding cannot fail.
            let _ = latency.add(&tally.latency);
        }
        report.requests = latency.len();
        if !latency.is_empty() {
            report.p50_ns = latency.value_at_quantile(0.5);
            report.p99_ns = latency.value_at_quantile(0.99);
            report.p999_ns = latency.value_at_quantile(0.999);
            report.max_ns = latency.max();
        }
        report
    }

    /// Requests answered per second, rounded.
    fn decisions_per_s(&self) -> u64 {
        let seconds = self.elapsed.as_secs_f64();
        if seconds > 0.0 {
            (self.requests as f64 / seconds).round() as u64
        } else {
            0
        }
    }

    /// What the user should know besides the figures (printed on stderr).
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if let Some(first) = &self.first_error {
            warnings.push(format!(
                "{} of {} requests failed; the first: {first}",
                self.errors, self.requests
            ));
        }
        if let Kind::Target {
            limit_applied: Some(false),
            domain,
            ..
        } = &self.kind
        {
            warnings.push(format!(
                "no limit applied to the warm-up request: no rule of domain \"{domain}\" matches its \
                 descriptors, so the server answered without deciding anything"
            ));
        }
        warnings
    }

    /// One JSON object (without a newline).
    pub fn json(&self) -> String {
        let mut object = serde_json::Map::new();
        let mut put = |name: &str, value: serde_json::Value| {
            object.insert(name.to_owned(), value);
        };
        match &self.kind {
            Kind::Store { store, op, tasks, .. } => {
                put("store", (*store).clone().into());
                put("op", (*op).into());
                put("tasks", (*tasks).into());
            }
            Kind::Target {
                target,
                request,
                connections,
                ..
            } => {
                put("target", target.clone().into());
                put("request", (*request).into());
                put("connections", (*connections).into());
            }
        }
        put("keys", self.keys.into());
        put("requests", self.requests.into());
        let (allowed, denied) = match self.kind {
            Kind::Store { .. } => ("allowed", "denied"),
            Kind::Target { .. } => ("ok", "over_limit"),
        };
        put(allowed, self.allowed.into());
        put(denied, self.denied.into());
        if let Kind::Store { .. } = self.kind {
            put("units", self.units.into());
        }
        put("errors", self.errors.into());
        put("elapsed_s", self.elapsed.as_secs_f64().into());
        put("decisions_per_s", self.decisions_per_s().into());
        put("p50_us", micros(self.p50_ns).into());
        put("p99_us", micros(self.p99_ns).into());
        put("p999_us", micros(self.p999_ns).into());
        put("max_us", micros(self.max_ns).into());
        match &self.kind {
            Kind::Store {
                server_time_start_us,
                server_time_end_us,
                ..
            } => {
                put("server_time_start_us", (*server_time_start_us).into());
                put("server_time_end_us", (*server_time_end_us).into());
                put("store_calls", self.store_calls().into());
                let per_decision = (self.store_calls_per_decision() * 1e4).round() / 1e4;
                put("store_calls_per_decision", per_decision.into());
            }
            Kind::Target {
                warmup_requests,
                limit_applied,
                ..
            } => {
                put("warmup_requests", (*warmup_requests).into());
                put("limit_applied", (*limit_applied).into());
            }
        }
        if let Some(engine) = self.engine {
            put("engine", engine.into());
        }
        if let Some(cpu) = self.cpu_us_per_decision() {
            put("cpu_us_per_decision", ((cpu * 100.0).round() / 100.0).into());
        }
        if let Some(resilience) = &self.resilience {
            for (path, count) in Path::ALL.iter().zip(resilience.paths) {
                object.insert(format!("path_{}", path.as_str()), count.into());
            }
            object.insert("fallback_p99_us".to_owned(), micros(resilience.fallback_p99_ns).into());
            object.insert("recovered_at_unix_ms".to_owned(), resilience.recovered_at_ms.into());
        }
        serde_json::Value::Object(object).to_string()
    }

    /// Aligned lines for people.
    /// The text summary's lines on this process: its store calls, the
    /// engine, its CPU.
    fn write_process(&self, out: &mut String) {
        if matches!(self.kind, Kind::Store { .. }) {
            let _ = writeln!(
                out,
                "store calls  {} ({:.4} per decision)",
                self.store_calls(),
                self.store_calls_per_decision()
            );
        }
        if let Some(engine) = self.engine {
            let _ = writeln!(out, "engine       {engine}");
        }
        if let Some(cpu) = self.cpu_us_per_decision() {
            let _ = writeln!(out, "cpu          {cpu:.2} us per decision (this process)");
        }
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        let (allowed, denied) = match &self.kind {
            Kind::Store { store, op, tasks, .. } => {
                let _ = writeln!(
                    out,
                    "store        {store} ({}, {}, op {op})",
                    plural(u64::from(*tasks), "task"),
                    plural(self.keys, "key"),
                );
                ("allowed     ", "denied      ")
            }
            Kind::Target {
                target,
                request,
                connections,
                ..
            } => {
                let _ = writeln!(
                    out,
                    "target       {target} ({request}, {}, {})",
                    plural(u64::from(*connections), "connection"),
                    plural(self.keys, "key"),
                );
                ("ok          ", "over_limit  ")
            }
        };
        let _ = writeln!(
            out,
            "requests     {} in {:.3} s: {} decisions/s",
            self.requests,
            self.elapsed.as_secs_f64(),
            self.decisions_per_s()
        );
        let _ = writeln!(out, "{allowed} {}", self.allowed);
        let _ = writeln!(out, "{denied} {}", self.denied);
        let _ = writeln!(out, "errors       {}", self.errors);
        let _ = writeln!(
            out,
            "latency      p50 {} us, p99 {} us, p99.9 {} us, max {} us",
            micros(self.p50_ns),
            micros(self.p99_ns),
            micros(self.p999_ns),
            micros(self.max_ns)
        );
        self.write_process(&mut out);
        if let Some(resilience) = &self.resilience {
            let paths: Vec<String> = Path::ALL
                .iter()
                .zip(resilience.paths)
                .map(|(path, count)| format!("{} {count}", path.as_str()))
                .collect();
            let _ = writeln!(out, "paths        {}", paths.join(", "));
            let _ = writeln!(
                out,
                "fallback     p99 {} us (decisions the store did not make)",
                micros(resilience.fallback_p99_ns)
            );
            if let Some(at) = resilience.recovered_at_ms {
                let _ = writeln!(out, "recovered    at {at} ms since the Unix epoch");
            }
        }
        match &self.kind {
            Kind::Store {
                server_time_start_us,
                server_time_end_us,
                ..
            } => {
                let span = server_time_end_us.saturating_sub(*server_time_start_us);
                let _ = writeln!(
                    out,
                    "store time   {server_time_start_us} us to {server_time_end_us} us (span {span} us)"
                );
            }
            Kind::Target {
                warmup_requests,
                limit_applied,
                ..
            } => {
                let applied = match limit_applied {
                    Some(true) => ", a limit applied",
                    Some(false) => ", NO limit applied",
                    None => "",
                };
                let _ = writeln!(
                    out,
                    "warm-up      {} before the clock{applied}",
                    plural(*warmup_requests, "request"),
                );
            }
        }
        out
    }
}
