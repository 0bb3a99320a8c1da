//! `tollgate simulate`: replays a trace against a limit on a controlled clock
//! (DESIGN §6).
//!
//! Each line of standard input is one step, decided at `--start` + `t_ms` and
//! answered by one line on standard output, written and flushed before the
//! next line is read, so a program can drive the simulation step by step. A
//! step that cannot be run is answered with `{"error": …}` and changes
//! nothing, not even the simulated time; the replay goes on.
//!
//! On the embedded memory store the simulation decides synchronously
//! (`decide_now` on a manual clock), so no async runtime is needed. With
//! `--store redis://…` every step is one script call carrying its instant
//! (`Request::at`), run on a single-threaded runtime, so both stores answer
//! the same trace line for line; the keys it wrote are reset at the end.
//!
//! `--limit` may be repeated to replay one trace against several limits side
//! by side (each on its own store); `--plot` draws the replay.

mod output;
mod plot;
mod step;

use std::collections::BTreeMap;
use std::io::{self, BufRead, Write};
use std::path::PathBuf;

use anyhow::Context as _;
use tollgate::{
    Decision, LeasedStore, ManualClock, MemoryStore, Op, Outcome, Policy, RedisStore, Request, Store, Subject,
    Timestamp,
};

use self::step::{Echo, Step, StepError, StepOp};
use crate::store::{self, StoreUrl};
use crate::UsageError;

/// The latest simulated instant, µs since the epoch: 2^53, the largest
/// integer Redis's Lua numbers hold exactly (about the year 2255).
const MAX_NOW: u64 = 1 << 53;

const TRACE_HELP: &str = "\
Standard input holds one step per line (JSON Lines):

  {\"t_ms\": 0, \"key\": \"a\", \"op\": \"check\", \"cost\": 1}

  t_ms         milliseconds since --start; may be fractional down to the
               microsecond (0.001); must never decrease (required)
  key          the subject (default: \"\")
  op           check (default; cost 0 is a peek), check_at_most, reserve,
               acquire, release, reset, record (units spent already,
               counted whether or not they fit)
  cost         units the step weighs (default 1)
  max_wait_ms  reserve / acquire: the longest acceptable wait (default, or
               beyond 2^53 us: any)
  lease        release: the lease an acquire answered with (required);
               acquire: renew or name a lease (default: \"1\", \"2\", ... in
               the order leases are granted)

Each step is answered on standard output as soon as it is read:

  {\"allowed\":true,\"limit\":5,\"remaining\":4,\"retry_after_ms\":0,\"reset_after_ms\":100,\"wait_ms\":0}

plus \"granted\" (check_at_most), \"lease\" (a granted acquire) and, for a policy
of named limits, \"limits\": each limit's own decision. retry_after_ms is null
when the request can never be admitted. reset answers with a peek after the
reset. An invalid step is answered with {\"error\":\"...\"}, changes nothing and
the replay goes on; blank lines are skipped.

With --store redis://..., the replay writes its keys under --prefix (a fresh
tollgate-sim-<random hex> per run unless given) and resets every key it
touched when the trace ends, unless --keep-keys: Redis keeps keys written
with an explicit time for at least an hour. A store that cannot be reached
or fails mid-replay ends the replay with exit code 1.

Several --limit options replay the same trace against each limit, each on
its own store (in Redis, under <prefix>-1, <prefix>-2, ...): each step is
then answered by a JSON array holding one answer per --limit, in order (the
table has one row per limit).

--plot FILE.svg or --plot FILE.png also draws the replay when the trace
ends: one panel per limit (per named limit of a policy), remaining over
time, admitted requests as green dots and denied ones as red crosses.

Example:
  tollgate simulate --limit '{\"algorithm\":\"gcra\",\"rate\":5,\"period\":\"1s\",\"burst\":3}' \\
      --format table < examples/burst.jsonl";

/// Arguments of `tollgate simulate`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = TRACE_HELP)]
pub struct Args {
    /// The limit as JSON, e.g. '{"algorithm":"gcra","rate":10,"period":"1s","burst":5}',
    /// or a policy of named limits '{"per_second":{...},"per_hour":{...}}';
    /// repeat to compare several limits over one trace
    #[arg(long, value_name = "JSON", required = true)]
    limit: Vec<String>,
    /// Unix time in seconds at t_ms = 0 (places epoch-aligned windows)
    #[arg(long, value_name = "UNIX_SECONDS", default_value_t = 0)]
    start: u64,
    /// How to write the decisions
    #[arg(long, value_enum, default_value_t = Format::Json)]
    format: Format,
    /// Where limit state lives: "memory" (embedded) or a Redis URL
    /// (redis://[user:password@]host[:port][/db], rediss:// for TLS,
    /// redis+cluster://host:port[,host:port...] for a Cluster,
    /// redis+sentinel://host:port[,host:port...]/<master name> behind Sentinels)
    #[arg(long, value_name = "URL", default_value = "memory")]
    store: String,
    /// Redis: the prefix of every key written [default: tollgate-sim-<random hex>]
    #[arg(long, value_name = "PREFIX")]
    prefix: Option<String>,
    /// Redis: keep the keys when the trace ends (default: reset them)
    #[arg(long)]
    keep_keys: bool,
    /// Also draw the replay into FILE.svg or FILE.png (by the extension):
    /// remaining over time, admitted and denied requests, a panel per limit
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
}

/// How decisions are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One JSON object per line
    Json,
    /// An aligned table for people
    Table,
}

/// Runs `tollgate simulate` on standard input and output.
///
/// # Errors
///
/// A [`UsageError`] for an invalid `--limit`, `--start` or `--store`; an I/O
/// error when standard input or output fails.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let url = StoreUrl::parse(&args.store)?;
    if url == StoreUrl::Memory && (args.prefix.is_some() || args.keep_keys) {
        return Err(UsageError("--prefix and --keep-keys apply only to a Redis store".to_owned()).into());
    }
    if let Some(path) = &args.plot {
        plot::Kind::of(path).map_err(|error| UsageError(error.to_string()))?;
    }
    let several = args.limit.len() > 1;
    let mut simulations = args
        .limit
        .iter()
        .enumerate()
        .map(|(at, limit)| {
            Simulation::new(limit, args.start).map_err(|UsageError(message)| {
                match message.strip_prefix("invalid --limit") {
                    Some(rest) if several => UsageError(format!("invalid --limit (the {}.){rest}", at + 1)),
                    _ => UsageError(message),
                }
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if let StoreUrl::Redis(url) = &url {
        let prefix = args
            .prefix
            .clone()
            .unwrap_or_else(|| format!("tollgate-sim-{:016x}", fastrand::u64(..)));
        for (at, simulation) in simulations.iter_mut().enumerate() {
            let prefix = if several {
                format!("{prefix}-{}", at + 1)
            } else {
                prefix.clone()
            };
            simulation.use_redis(url, &prefix, args.keep_keys)?;
        }
    }
    if args.plot.is_some() {
        for simulation in &mut simulations {
            simulation.record();
        }
    }
    let result = replay(&mut simulations, io::stdin().lock(), io::stdout().lock(), args.format);
    let series: Vec<plot::Series> = simulations.iter_mut().filter_map(Simulation::take_series).collect();
    let mut cleanup = Ok(());
    for simulation in simulations {
        cleanup = cleanup.and(simulation.finish());
    }
    match result {
        // The reader went away: nobody is left to answer.
        Err(error) if is_broken_pipe(&error) => {}
        Err(error) => return Err(error.context("simulate")),
        Ok(()) => {}
    }
    cleanup?;
    match &args.plot {
        Some(path) => plot::draw(path, &series),
        None => Ok(()),
    }
}

fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error
        .downcast_ref::<io::Error>()
        .is_some_and(|error| error.kind() == io::ErrorKind::BrokenPipe)
}

/// Reads steps from `input` until it ends, writing and flushing one answer
/// per step (a header first, for the table): with several simulations, a
/// JSON array of their answers (one table row each).
///
/// # Errors
///
/// When reading or writing fails, or the store fails; invalid steps are
/// answered, not errors.
pub fn replay(
    simulations: &mut [Simulation],
    mut input: impl BufRead,
    mut output: impl Write,
    format: Format,
) -> anyhow::Result<()> {
    if format == Format::Table {
        writeln!(output, "{}", output::table_header())?;
        output.flush()?;
    }
    let mut line = Vec::new();
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        let text = match std::str::from_utf8(&line) {
            Ok(text) if text.trim().is_empty() => continue,
            Ok(text) => Some(text),
            Err(_) => None,
        };
        let mut answers = Vec::with_capacity(simulations.len());
        for simulation in simulations.iter_mut() {
            answers.push(match text {
                Some(text) => simulation.step(text)?,
                None => Answer::invalid(None, StepError::NotUtf8),
            });
        }
        let text = match (format, answers.as_slice()) {
            (Format::Json, [answer]) => output::json(answer),
            (Format::Json, answers) => {
                let answers: Vec<String> = answers.iter().map(output::json).collect();
                format!("[{}]", answers.join(","))
            }
            (Format::Table, [answer]) => output::table_row(answer, None),
            (Format::Table, answers) => {
                let rows: Vec<String> = answers
                    .iter()
                    .enumerate()
                    .map(|(at, answer)| output::table_row(answer, Some(at + 1)))
                    .collect();
                rows.join("\n")
            }
        };
        writeln!(output, "{text}")?;
        output.flush()?;
    }
}

/// `outcome` as one line of JSON, as a `check` step would be answered.
pub fn outcome_json(outcome: &Outcome) -> String {
    output::json(&Answer {
        echo: None,
        result: Ok(Decided {
            decision: outcome.decision.clone(),
            granted: None,
            lease: outcome.lease.clone(),
            limits: outcome.limits.clone(),
        }),
    })
}

/// The answer to one step.
#[derive(Debug)]
pub struct Answer {
    /// The step as written, when it was a JSON object (for the table).
    echo: Option<Echo>,
    /// Its decision, or why it could not be run.
    result: Result<Decided, StepError>,
}

impl Answer {
    fn invalid(echo: Option<Echo>, error: StepError) -> Self {
        Self {
            echo,
            result: Err(error),
        }
    }
}

/// A step's decision, with what its operation adds.
#[derive(Debug)]
struct Decided {
    decision: Decision,
    /// `check_at_most`: units admitted.
    granted: Option<u64>,
    /// A granted `acquire` on a concurrency limit: the lease taken.
    lease: Option<String>,
    /// A policy of named limits: each limit's decision, in order (else empty).
    limits: Vec<(String, Decision)>,
}

/// A policy over a fresh store on a simulated clock.
pub struct Simulation {
    policy: Policy,
    backend: Backend,
    /// A policy with a lease: the process's blocks, taken from the backend's
    /// store (on memory too: the replay shows what a leasing process
    /// answers, whatever the store).
    leased: Option<Leased>,
    /// `--start`, µs since the epoch.
    start: u64,
    /// `t_ms` of the last step that ran, in µs.
    last: Option<u64>,
    /// The next lease name an `acquire` without `lease` gets.
    next_lease: u64,
    /// The plot's panels, by title: one per limit of the policy.
    titles: Vec<String>,
    /// With `--plot`: every step decided.
    recorded: Option<Vec<plot::Point>>,
}

/// A leasing process's blocks over the backend's store.
enum Leased {
    Memory {
        store: LeasedStore<MemoryStore>,
        runtime: tokio::runtime::Runtime,
    },
    Redis(LeasedStore<RedisStore>),
}

/// Where a simulation decides.
enum Backend {
    /// A memory store whose clock the steps set.
    Memory { store: MemoryStore, clock: ManualClock },
    /// A Redis server, told each step's instant.
    Redis(RedisBackend),
}

struct RedisBackend {
    store: RedisStore,
    runtime: tokio::runtime::Runtime,
    /// The subjects written to, by encoded key, reset at the end unless
    /// `keep_keys`. The subjects themselves are kept: a key is already
    /// encoded, and encoding it again would name another subject.
    touched: BTreeMap<String, Subject>,
    keep_keys: bool,
}

/// Why a step did not run.
#[derive(Debug)]
enum Failure {
    /// The step is invalid: answered with `{"error": …}`, the replay goes on.
    Invalid(StepError),
    /// The store failed: the replay ends (exit code 1), since the answers
    /// that would follow could not be compared with another store's.
    Store(tollgate::Error),
}

impl From<StepError> for Failure {
    fn from(error: StepError) -> Self {
        Self::Invalid(error)
    }
}

impl From<tollgate::Error> for Failure {
    fn from(error: tollgate::Error) -> Self {
        if error.is_invalid() {
            Self::Invalid(StepError::Refused(error))
        } else {
            Self::Store(error)
        }
    }
}

impl Simulation {
    /// A simulation of `limit` (a limit or a policy, as JSON) starting at
    /// `start` seconds since the Unix epoch, on a fresh memory store.
    ///
    /// # Errors
    ///
    /// When the limit is invalid (the message names the field) or `start` is
    /// out of range.
    pub fn new(limit: &str, start: u64) -> Result<Self, UsageError> {
        let policy = Policy::from_json(limit).map_err(|error| UsageError(format!("invalid --limit: {error}")))?;
        let titles = plot::titles(limit);
        let start = start
            .checked_mul(1_000_000)
            .filter(|&start| start <= MAX_NOW)
            .ok_or_else(|| UsageError(format!("--start must be at most {} (2^53 us)", MAX_NOW / 1_000_000)))?;
        let clock = ManualClock::new(Timestamp::from_micros(start));
        let memory = MemoryStore::with_clock(clock.clone());
        let leased = match policy.lease() {
            Some(_) => Some(Leased::Memory {
                store: LeasedStore::with_clock(memory.clone(), clock.clone()).leasing(true),
                runtime: tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|error| UsageError(format!("cannot start the async runtime: {error}")))?,
            }),
            None => None,
        };
        Ok(Self {
            policy,
            leased,
            backend: Backend::Memory { store: memory, clock },
            start,
            last: None,
            next_lease: 1,
            titles,
            recorded: None,
        })
    }

    /// Keeps every decided step from now on, for [`Simulation::take_series`].
    pub fn record(&mut self) {
        self.recorded.get_or_insert_with(Vec::new);
    }

    /// What was recorded, for the plot: a panel per limit of a policy of
    /// several limits, else one.
    fn take_series(&mut self) -> Option<plot::Series> {
        let points = self.recorded.take()?;
        Some(plot::Series {
            panels: self.titles.clone(),
            points,
        })
    }

    /// Decides in the Redis server at `url` instead, with keys under `prefix`.
    ///
    /// # Errors
    ///
    /// An invalid URL or prefix ([`UsageError`]), or a server that cannot be
    /// reached.
    pub fn use_redis(&mut self, url: &str, prefix: &str, keep_keys: bool) -> anyhow::Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        let store = runtime.block_on(store::connect_redis(url, prefix))?;
        if self.leased.is_some() {
            self.leased = Some(Leased::Redis(LeasedStore::new(store.clone())));
        }
        self.backend = Backend::Redis(RedisBackend {
            store,
            runtime,
            touched: BTreeMap::new(),
            keep_keys,
        });
        Ok(())
    }

    /// Ends the simulation: resets every Redis key it wrote, unless kept.
    ///
    /// # Errors
    ///
    /// When Redis fails to reset a key.
    pub fn finish(self) -> anyhow::Result<()> {
        let Backend::Redis(redis) = self.backend else {
            return Ok(());
        };
        // What the blocks hold goes back, at the last step's instant.
        if let Some(Leased::Redis(leased)) = &self.leased {
            let now = Timestamp::from_micros(self.start + self.last.unwrap_or(0));
            redis.runtime.block_on(leased.close(Some(now)));
        }
        if redis.keep_keys {
            return Ok(());
        }
        let RedisBackend {
            store,
            runtime,
            touched,
            ..
        } = redis;
        runtime.block_on(async {
            for subject in touched.values() {
                store
                    .reset(subject, &self.policy)
                    .await
                    .with_context(|| format!("simulate: cannot reset the keys under {}", store.prefix()))?;
            }
            Ok(())
        })
    }

    /// Decides `request` at `now` in the simulation's store.
    fn decide(&mut self, subject: &Subject, request: &Request) -> tollgate::Result<Outcome> {
        match (&mut self.backend, &self.leased) {
            (Backend::Memory { clock, .. }, Some(Leased::Memory { store, runtime })) => {
                if let Some(now) = request.now {
                    clock.set(now);
                }
                return runtime.block_on(store.decide(subject, &self.policy, request));
            }
            (Backend::Redis(redis), Some(Leased::Redis(store))) => {
                if !redis.touched.contains_key(subject.as_key()) {
                    redis.touched.insert(subject.as_key().to_owned(), subject.clone());
                }
                return redis.runtime.block_on(store.decide(subject, &self.policy, request));
            }
            _ => {}
        }
        match &mut self.backend {
            Backend::Memory { store, clock } => {
                if let Some(now) = request.now {
                    clock.set(now);
                }
                store.decide_now(subject, &self.policy, request)
            }
            Backend::Redis(redis) => {
                if !redis.touched.contains_key(subject.as_key()) {
                    redis.touched.insert(subject.as_key().to_owned(), subject.clone());
                }
                redis
                    .runtime
                    .block_on(redis.store.decide(subject, &self.policy, request))
            }
        }
    }

    /// Forgets `subject`'s state.
    fn reset(&mut self, subject: &Subject) -> tollgate::Result<()> {
        // The block goes with the state it came from.
        match (&self.backend, &self.leased) {
            (_, Some(Leased::Memory { store, runtime })) => {
                return runtime.block_on(store.reset(subject, &self.policy));
            }
            (Backend::Redis(redis), Some(Leased::Redis(store))) => {
                return redis.runtime.block_on(store.reset(subject, &self.policy));
            }
            _ => {}
        }
        match &mut self.backend {
            Backend::Memory { store, .. } => {
                store.reset_now(subject, &self.policy);
                Ok(())
            }
            Backend::Redis(redis) => redis.runtime.block_on(redis.store.reset(subject, &self.policy)),
        }
    }

    /// Runs one line of the trace.
    ///
    /// # Errors
    ///
    /// A store fault, which ends the replay; an invalid step is answered.
    pub fn step(&mut self, line: &str) -> anyhow::Result<Answer> {
        let value: serde_json::Value = match serde_json::from_str(line) {
            Ok(value) => value,
            Err(error) => return Ok(Answer::invalid(None, StepError::Json(error))),
        };
        let echo = Echo::of(&value);
        let result = match Step::from_value(value)
            .map_err(Failure::Invalid)
            .and_then(|step| self.run(&step))
        {
            Ok(decided) => Ok(decided),
            Err(Failure::Invalid(error)) => Err(error),
            Err(Failure::Store(error)) => return Err(anyhow::Error::new(error)),
        };
        Ok(Answer {
            echo: Some(echo),
            result,
        })
    }

    fn run(&mut self, step: &Step) -> Result<Decided, Failure> {
        if let Some(last) = self.last.filter(|&last| step.t_us < last) {
            return Err(Failure::Invalid(StepError::TimeGoesBack {
                t_ms: output::millis(step.t_us),
                last: output::millis(last),
            }));
        }
        let now = self
            .start
            .checked_add(step.t_us)
            .filter(|&now| now <= MAX_NOW)
            .ok_or(StepError::TimePastEnd)?;
        let now = Timestamp::from_micros(now);
        let subject = Subject::new(&step.key);
        let request = |op: Op, cost: u64| Request::new(op, cost).at(now);
        let outcome: Outcome = match &step.op {
            StepOp::Check => self.decide(&subject, &request(Op::Check, step.cost))?,
            StepOp::CheckAtMost => self.decide(&subject, &request(Op::CheckAtMost, step.cost))?,
            StepOp::Record => self.decide(&subject, &request(Op::Record, step.cost))?,
            StepOp::Reserve { max_wait } => {
                self.decide(&subject, &request(Op::Reserve { max_wait: *max_wait }, step.cost))?
            }
            StepOp::Acquire { lease, max_wait } => {
                let lease = lease.clone().unwrap_or_else(|| self.next_lease.to_string());
                let op = Op::Acquire {
                    lease,
                    max_wait: *max_wait,
                };
                self.decide(&subject, &request(op, step.cost))?
            }
            StepOp::Release { lease } => self.decide(&subject, &request(Op::Release { lease: lease.clone() }, 0))?,
            StepOp::Reset => {
                self.reset(&subject)?;
                self.decide(&subject, &request(Op::Check, 0))?
            }
        };
        if matches!(step.op, StepOp::Acquire { lease: None, .. }) && outcome.lease.is_some() {
            self.next_lease += 1;
        }
        self.last = Some(step.t_us);
        if let Some(recorded) = &mut self.recorded {
            let values = if outcome.limits.len() > 1 {
                outcome
                    .limits
                    .iter()
                    .map(|(_, decision)| (decision.remaining, decision.limit))
                    .collect()
            } else {
                vec![(outcome.decision.remaining, outcome.decision.limit)]
            };
            recorded.push(plot::Point {
                t_us: step.t_us,
                key: step.key.clone(),
                allowed: outcome.decision.allowed,
                values,
            });
        }
        Ok(Decided {
            decision: outcome.decision,
            granted: matches!(step.op, StepOp::CheckAtMost).then_some(outcome.granted),
            lease: outcome.lease,
            limits: outcome.limits,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replay_text(limit: &str, trace: &str) -> String {
        let mut simulation = Simulation::new(limit, 0).unwrap();
        let mut out = Vec::new();
        replay(
            std::slice::from_mut(&mut simulation),
            trace.as_bytes(),
            &mut out,
            Format::Json,
        )
        .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn blank_lines_are_skipped_and_invalid_utf8_is_answered() {
        let limit = r#"{"algorithm":"fixed_window","limit":1,"window":"1s"}"#;
        let mut simulation = Simulation::new(limit, 0).unwrap();
        let mut out = Vec::new();
        let trace: &[u8] = b"\n  \r\n\xff\n{\"t_ms\":0}\n";
        replay(std::slice::from_mut(&mut simulation), trace, &mut out, Format::Json).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"error\":\"the step is not valid UTF-8\"}\n\
             {\"allowed\":true,\"limit\":1,\"remaining\":0,\"retry_after_ms\":0,\"reset_after_ms\":1000,\"wait_ms\":0}\n"
        );
    }

    #[test]
    fn start_places_epoch_aligned_windows() {
        let limit = r#"{"algorithm":"fixed_window","limit":1,"window":"1m"}"#;
        let mut simulation = Simulation::new(limit, 90).unwrap();
        let mut out = Vec::new();
        replay(
            std::slice::from_mut(&mut simulation),
            &b"{\"t_ms\":0}\n"[..],
            &mut out,
            Format::Json,
        )
        .unwrap();
        // 90 s is halfway through the window [60 s, 120 s).
        assert!(String::from_utf8(out).unwrap().contains("\"reset_after_ms\":30000"));
        assert!(Simulation::new(limit, u64::MAX).is_err());
    }

    #[test]
    fn an_invalid_step_does_not_move_the_clock() {
        let limit = r#"{"algorithm":"fixed_window","limit":5,"window":"1s"}"#;
        let out = replay_text(limit, "{\"t_ms\":10}\n{\"t_ms\":20,\"op\":\"nope\"}\n{\"t_ms\":15}\n");
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[1].starts_with("{\"error\":"), "{}", lines[1]);
        assert!(lines[2].starts_with("{\"allowed\":true"), "{}", lines[2]);
    }
}
