//! The summary of a run: counts, throughput, latency percentiles and the
//! store's clock at both ends, as one JSON object or as text for people.

use std::fmt::Write as _;
use std::time::Duration;

use super::{histogram, Plan, Tally};

/// The figures of a finished run.
#[derive(Debug)]
pub struct Report {
    store: String,
    op: &'static str,
    tasks: u32,
    keys: u64,
    pub requests: u64,
    allowed: u64,
    denied: u64,
    pub errors: u64,
    /// The first store fault met, if any.
    pub first_error: Option<String>,
    elapsed: Duration,
    p50_ns: u64,
    p99_ns: u64,
    max_ns: u64,
    server_time_start_us: u64,
    server_time_end_us: u64,
}

/// `ns` in microseconds, to the nanosecond.
fn micros(ns: u64) -> f64 {
    ns as f64 / 1_000.0
}

impl Report {
    /// Adds up the tasks' tallies.
    pub(super) fn new(
        plan: &Plan,
        tallies: Vec<Tally>,
        elapsed: Duration,
        server_time_start_us: u64,
        server_time_end_us: u64,
    ) -> Self {
        let mut latency = histogram();
        let mut report = Self {
            store: plan.store.display(),
            op: plan.op.name(),
            tasks: plan.tasks,
            keys: plan.keys,
            requests: 0,
            allowed: 0,
            denied: 0,
            errors: 0,
            first_error: None,
            elapsed,
            p50_ns: 0,
            p99_ns: 0,
            max_ns: 0,
            server_time_start_us,
            server_time_end_us,
        };
        for tally in tallies {
            report.allowed += tally.allowed;
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

    /// One JSON object (without a newline).
    pub fn json(&self) -> String {
        serde_json::json!({
            "store": self.store,
            "op": self.op,
            "tasks": self.tasks,
            "keys": self.keys,
            "requests": self.requests,
            "allowed": self.allowed,
            "denied": self.denied,
            "errors": self.errors,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "decisions_per_s": self.decisions_per_s(),
            "p50_us": micros(self.p50_ns),
            "p99_us": micros(self.p99_ns),
            "max_us": micros(self.max_ns),
            "server_time_start_us": self.server_time_start_us,
            "server_time_end_us": self.server_time_end_us,
        })
        .to_string()
    }

    /// Aligned lines for people.
    pub fn text(&self) -> String {
        let plural = |count: u64, word: &str| {
            if count == 1 {
                format!("{count} {word}")
            } else {
                format!("{count} {word}s")
            }
        };
        let mut out = String::new();
        let _ = writeln!(
            out,
            "store        {} ({}, {}, op {})",
            self.store,
            plural(u64::from(self.tasks), "task"),
            plural(self.keys, "key"),
            self.op
        );
        let _ = writeln!(
            out,
            "requests     {} in {:.3} s: {} decisions/s",
            self.requests,
            self.elapsed.as_secs_f64(),
            self.decisions_per_s()
        );
        let _ = writeln!(out, "allowed      {}", self.allowed);
        let _ = writeln!(out, "denied       {}", self.denied);
        let _ = writeln!(out, "errors       {}", self.errors);
        let _ = writeln!(
            out,
            "latency      p50 {} us, p99 {} us, max {} us",
            micros(self.p50_ns),
            micros(self.p99_ns),
            micros(self.max_ns)
        );
        let span = self.server_time_end_us.saturating_sub(self.server_time_start_us);
        let _ = writeln!(
            out,
            "store time   {} us to {} us (span {} us)",
            self.server_time_start_us, self.server_time_end_us, span
        );
        out
    }
}
