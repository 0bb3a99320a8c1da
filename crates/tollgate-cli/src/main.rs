//! The `tollgate` command.
//!
//! Thin on purpose: parse the arguments, hand them to the subcommand's module,
//! turn its result into an exit code. Run under the name `ratelimit` (the
//! `/bin/ratelimit` that envoyproxy/ratelimit's image holds, and that Envoy
//! Gateway's Deployment runs without arguments), it is `tollgate serve`.
//! Exit codes: 0 on success, 2 for invalid
//! arguments (clap's own usage errors included), 3 for a `check` that was
//! denied, 1 for anything else.

// Doc comments on clap's arguments are `--help` text, written for a terminal:
// `redis://[user:password@]host` and `<random hex>` there are not links or HTML.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

mod api;
mod arg;
mod bench;
mod overrides;
mod serve;
mod simulate;
mod state;
mod store;
mod usage;

use std::fmt;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// A distributed rate limiter: every algorithm, one atomic decision per call.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay a trace (JSON Lines on stdin) against a limit on a controlled
    /// clock, one decision per step (JSON Lines on stdout).
    Simulate(simulate::Args),
    /// Put load on a store and report throughput and latency: a progress bar
    /// on stderr, a summary on stdout.
    Bench(bench::Args),
    /// Serve Envoy's rate limit gRPC protocol and an HTTP JSON API, with
    /// limits from envoyproxy/ratelimit configuration files.
    Serve(serve::Args),
    /// Decide one request for a subject and print the decision as a JSON
    /// line; exit code 0 when admitted, 3 when denied.
    Check(state::CheckArgs),
    /// Print a subject's state as a peek reports it (a JSON line); consumes
    /// nothing.
    Inspect(state::Args),
    /// Forget a subject's state under each limit, then print a peek (a JSON
    /// line).
    Reset(state::Args),
    /// A running server's limits for one descriptor, changed while it runs
    /// (`/v1/overrides`): set, list, delete.
    Override(overrides::Args),
    /// Where a running server's limits stand below a descriptor prefix
    /// (`/v1/usage`), as a table; consumes nothing.
    Usage(usage::Args),
}

/// An argument the command cannot work with (exit code 2).
#[derive(Debug)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// `error` and its causes on one line, each said once: a cause whose text
/// an outer message already carries is not repeated.
pub(crate) fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// The arguments, with `serve` put first when the binary runs as `ratelimit`.
fn arguments() -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let named_ratelimit = args
        .first()
        .and_then(|first| std::path::Path::new(first).file_name())
        .is_some_and(|name| name == "ratelimit");
    if named_ratelimit {
        args.insert(1, "serve".into());
    }
    args
}

fn main() -> ExitCode {
    let cli = Cli::parse_from(arguments());
    let result = match cli.command {
        Command::Simulate(args) => simulate::run(&args).map(|()| true),
        Command::Bench(args) => bench::run(&args).map(|()| true),
        Command::Serve(args) => serve::run(&args).map(|()| true),
        Command::Check(args) => state::check(&args),
        Command::Inspect(args) => state::inspect(&args).map(|()| true),
        Command::Reset(args) => state::reset(&args).map(|()| true),
        Command::Override(args) => overrides::run(&args).map(|()| true),
        Command::Usage(args) => usage::run(&args).map(|()| true),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(state::DENIED),
        Err(error) => {
            eprintln!("error: {}", one_line(&error));
            if error.is::<UsageError>() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_cause_is_said_once() {
        let text = "Connection refused (os error 111)";
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, text);
        let error = anyhow::Error::new(refused)
            .context(format!("redis: {text}"))
            .context("cannot use the store at redis://127.0.0.1:1");
        let line = super::one_line(&error);
        assert_eq!(
            line,
            format!("cannot use the store at redis://127.0.0.1:1: redis: {text}")
        );
    }
}
