//! `tollgate check | inspect | reset`: one operation on one subject's state
//! in any store (DESIGN §6), for operators and scripts.
//!
//! Each prints one decision as `simulate` prints one (a JSON line). `check`
//! decides and consumes; `inspect` is a peek (cost 0), which consumes
//! nothing; `reset` forgets the subject's state under each limit and then
//! answers with a peek, so the line shows the untouched state.
//!
//! The memory store lives in the process, so with `--store memory` each
//! command starts from nothing: useful to see how a limit answers a first
//! request, not to keep state between commands.

use anyhow::Context as _;
use tollgate::{AnyStore, MemoryStore, Op, Outcome, Policy, Request, Store, Subject};

use crate::simulate;
use crate::store::{self, StoreUrl};
use crate::UsageError;

/// The exit code of a `check` that was denied.
pub const DENIED: u8 = 3;

const STORE_HELP: &str = "\
The subject is given as one or more parts, joined as the library's
Subject::from_parts joins them: `tollgate check ... 203.0.113.7 /login`
names the same state as Subject::new(\"203.0.113.7\").and(\"/login\").

Keys in Redis are <prefix>:{<subject>}:<limit name>, where a single limit
(not a policy of named limits) is named after its algorithm (gcra,
fixed_window, ...): a command given the same --limit, --prefix and subject
as a service using the library works on that service's state.

With --store memory (the default) the state lives in this process only:
every command starts from an untouched limit, so check answers as for a
first request, inspect shows a full limit, and reset has nothing to forget.
Use a Redis store to work on state shared with other processes.";

/// What every subcommand of this module takes.
#[derive(Debug, clap::Args)]
pub struct Target {
    /// Where limit state lives: "memory" (this process only, so always
    /// fresh) or a Redis URL (redis://[user:password@]host[:port][/db],
    /// rediss:// for TLS)
    #[arg(long, value_name = "URL", default_value = "memory")]
    store: String,
    /// The limit as JSON, e.g. '{"algorithm":"gcra","rate":10,"period":"1s","burst":5}',
    /// or a policy of named limits '{"per_second":{...},"per_hour":{...}}'
    #[arg(long, value_name = "JSON")]
    limit: String,
    /// Redis: the prefix of every key [default: tollgate]
    #[arg(long, value_name = "PREFIX")]
    prefix: Option<String>,
    /// The subject: one argument per part
    #[arg(value_name = "SUBJECT", required = true, num_args = 1..)]
    subject: Vec<String>,
}

/// Arguments of `tollgate check`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = STORE_HELP)]
pub struct CheckArgs {
    #[command(flatten)]
    target: Target,
    /// Units the request weighs (0 is a peek, as `inspect`)
    #[arg(long, value_name = "N", default_value_t = 1)]
    cost: u64,
}

/// Arguments of `tollgate inspect` and `tollgate reset`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = STORE_HELP)]
pub struct Args {
    #[command(flatten)]
    target: Target,
}

/// What to do with the subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Check(u64),
    Inspect,
    Reset,
}

/// Runs `tollgate check`; true when the request was admitted.
///
/// # Errors
///
/// A [`UsageError`] for invalid arguments; a store that cannot be reached or
/// fails.
pub fn check(args: &CheckArgs) -> anyhow::Result<bool> {
    run(&args.target, Action::Check(args.cost))
}

/// Runs `tollgate inspect`.
///
/// # Errors
///
/// As [`check`].
pub fn inspect(args: &Args) -> anyhow::Result<()> {
    run(&args.target, Action::Inspect).map(drop)
}

/// Runs `tollgate reset`.
///
/// # Errors
///
/// As [`check`].
pub fn reset(args: &Args) -> anyhow::Result<()> {
    run(&args.target, Action::Reset).map(drop)
}

/// Prints the decision of `action` and returns whether it admitted.
fn run(target: &Target, action: Action) -> anyhow::Result<bool> {
    let url = StoreUrl::parse(&target.store)?;
    if url == StoreUrl::Memory && target.prefix.is_some() {
        return Err(UsageError("--prefix applies only to a Redis store".to_owned()).into());
    }
    let policy = Policy::from_json(&target.limit).map_err(|error| UsageError(format!("invalid --limit: {error}")))?;
    let subject = Subject::from_parts(&target.subject);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let outcome = runtime.block_on(async {
        let store = match &url {
            StoreUrl::Memory => AnyStore::Memory(MemoryStore::new()),
            StoreUrl::Redis(url) => {
                let prefix = target.prefix.as_deref().unwrap_or(tollgate::DEFAULT_PREFIX);
                AnyStore::Redis(store::connect_redis(url, prefix).await?)
            }
        };
        decide(&store, &subject, &policy, action).await
    })?;
    println!("{}", simulate::outcome_json(&outcome));
    Ok(outcome.decision.allowed)
}

async fn decide(store: &AnyStore, subject: &Subject, policy: &Policy, action: Action) -> anyhow::Result<Outcome> {
    let cost = match action {
        Action::Check(cost) => cost,
        Action::Inspect => 0,
        Action::Reset => {
            store.reset(subject, policy).await.map_err(store_error)?;
            0
        }
    };
    store
        .decide(subject, policy, &Request::new(Op::Check, cost))
        .await
        .map_err(store_error)
}

/// A store's error: bad arguments exit with 2, store faults with 1.
fn store_error(error: tollgate::Error) -> anyhow::Error {
    if error.is_invalid() {
        UsageError(error.to_string()).into()
    } else {
        anyhow::Error::new(error)
    }
}
