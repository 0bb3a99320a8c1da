//! The native engine: the Redis library's decisions made by the Rust
//! algorithms, over any [`Keyspace`], for the Redis module
//! (`tollgate-redis-module`), which runs it inside the server.
//!
//! [`Engine::run`] takes the library's calling convention ([`protocol`]:
//! the keys, and the arguments the Redis store sends the functions library,
//! a batch of decisions, each with its head, lease and limits) and answers
//! the library's reply, integer for integer. Each limit's state is read from its
//! key and written back in the encoding of its Lua version, so that module and
//! Lua clients can share a server (a rolling upgrade, a server without the
//! module for a while). The decision itself is `Policy::decide`, the code
//! the memory store runs.
//!
//! Writes go through the [`Keyspace`], which replicates them as they are: a
//! replica applies the effects, never re-runs the decision at another time.

use std::collections::HashMap;

use smallvec::SmallVec;

use crate::algorithm::{Encoded, Loaded, State, DERIVED};
pub use crate::algorithm::{Members, Scores, SortedSet, Value, Visit};
use crate::clock::Timestamp;
use crate::decision::{Crossing, Decision};
use crate::policy::Policy;
use crate::request::Request;

pub mod protocol;

use self::protocol::{
    push_head, push_limit, read_limit_text, split_limit_argument, unsigned, Head, OpCode, Outbox, ALLOWED, DENIED,
    FOREIGN, REPLY_HEAD, REPLY_PER_LIMIT,
};
pub use self::protocol::{CallError, PROTOCOL};

/// Where the engine reads and writes keys: the server's keyspace, inside
/// the command being run (so a decision is atomic). A sorted set is read a
/// few members at a time ([`SortedSet`]).
pub trait Keyspace: SortedSet {
    /// The server's time, µs since the Unix epoch.
    fn now(&mut self) -> u64;
    /// The whole value at `key`.
    fn read(&mut self, key: &[u8]) -> Value;
    /// `SET key value PX expire_ms`.
    fn set(&mut self, key: &[u8], value: &[u8], expire_ms: u64);
    /// Any other write: `UNLINK`, `HSET`, `HDEL`, `ZADD`, `ZREM`, `PEXPIRE`,
    /// and `XADD` to an alert outbox.
    fn command(&mut self, args: &[&[u8]]);
}

/// A decision's list of one entry per limit: inline for a few limits.
type Inline<T> = SmallVec<[T; 4]>;

/// With a caller's `now`, a key is kept at least this long (ms), as the Lua
/// library keeps it: real time and the caller's differ, and each state says
/// when it lapses in the caller's time.
const EXPLICIT_NOW_TTL_MS: u64 = 3_600_000;

/// Parsed limits kept at most (a server sees few distinct limits).
const MAX_KNOWN: usize = 1000;

/// The engine, with the limits it has parsed.
#[derive(Debug, Default)]
pub struct Engine {
    /// Policies of one limit by its text (without the cost).
    known: HashMap<Vec<u8>, Policy, foldhash::fast::RandomState>,
}

/// The request `head` asks, with the per-limit `costs`.
fn request(head: &Head, costs: Vec<u64>, now: u64) -> Result<Request, CallError> {
    let op = head.request_op().ok_or(CallError::Malformed("a reset is no request"))?;
    let mut request = Request::new(op, head.cost).at(Timestamp::from_micros(now));
    if !costs.is_empty() && costs.iter().any(|&cost| cost != head.cost) {
        request = request.with_costs(costs);
    }
    Ok(request)
}

/// The expiry, in ms, of a state that says something for `ttl` µs.
fn expire_ms(ttl: u64, explicit_now: bool) -> u64 {
    let ms = ttl.div_ceil(1000);
    if explicit_now {
        ms.max(EXPLICIT_NOW_TTL_MS)
    } else {
        ms
    }
}

impl Engine {
    /// A new engine.
    pub fn new() -> Self {
        Self::default()
    }

    /// The policy of one limit (text without its cost), parsed once.
    fn single(&mut self, text: &[u8]) -> Result<&Policy, CallError> {
        if !self.known.contains_key(text) {
            let policy = Policy::single(read_limit_text(text)?);
            if self.known.len() >= MAX_KNOWN {
                self.known.clear();
            }
            self.known.insert(text.to_vec(), policy);
        }
        self.known.get(text).ok_or(CallError::Malformed("no limit"))
    }

    /// Runs one call: `keys` and `args` as the functions library takes them.
    /// Returns the library's reply.
    ///
    /// # Errors
    ///
    /// Arguments not in the calling convention (nothing is written then for
    /// the decision at fault; earlier decisions of the batch are made).
    pub fn run(&mut self, keyspace: &mut impl Keyspace, keys: &[&[u8]], args: &[&[u8]]) -> Result<Vec<i64>, CallError> {
        let (&count, mut rest) = args.split_first().ok_or(CallError::Malformed("no arguments"))?;
        let count = unsigned(count, "the number of decisions")?;
        let decisions = usize::try_from(count).unwrap_or(1).min(64);
        let mut reply = Vec::with_capacity((REPLY_HEAD + REPLY_PER_LIMIT) * decisions);
        let mut keys = keys;
        let mut server_now = None;
        for _ in 0..count {
            let head = Head::parse(&mut rest)?;
            if rest.len() < head.limits || keys.len() < head.limits {
                return Err(CallError::Malformed("fewer limits or keys than the head says"));
            }
            let (limits, tail) = rest.split_at(head.limits);
            rest = tail;
            let outbox = if head.outbox {
                if rest.len() < 2 + head.limits {
                    return Err(CallError::Malformed("fewer outbox arguments than the head says"));
                }
                let (outbox, tail) = rest.split_at(2 + head.limits);
                rest = tail;
                Some(Outbox {
                    stream: outbox[0],
                    max_len: outbox[1],
                    labels: &outbox[2..],
                })
            } else {
                None
            };
            let (decision_keys, tail) = keys.split_at(head.limits);
            keys = tail;
            let now = match head.now {
                Some(now) => now,
                None => *server_now.get_or_insert_with(|| keyspace.now()),
            };
            self.decide(keyspace, decision_keys, &head, limits, now, &mut reply, outbox.as_ref())?;
        }
        Ok(reply)
    }

    /// One decision of a call, appended to `reply`; the alert thresholds it
    /// crosses added to `outbox`, when given.
    #[allow(clippy::too_many_arguments)]
    fn decide(
        &mut self,
        keyspace: &mut impl Keyspace,
        keys: &[&[u8]],
        head: &Head,
        limits: &[&[u8]],
        now: u64,
        reply: &mut Vec<i64>,
        outbox: Option<&Outbox<'_>>,
    ) -> Result<(), CallError> {
        if head.op == OpCode::Reset {
            for key in keys {
                keyspace.command(&[b"UNLINK", key]);
            }
            push_head(reply, ALLOWED, 0, now);
            return Ok(());
        }
        if let [text] = limits {
            let (text, cost) = split_limit_argument(text)?;
            let costs = if cost == head.cost { Vec::new() } else { vec![cost] };
            let request = request(head, costs, now)?;
            let policy = self.single(text)?;
            return decide_policy(keyspace, keys, head, policy, &request, now, reply, outbox);
        }
        let mut costs = Vec::with_capacity(limits.len());
        let mut named = Vec::with_capacity(limits.len());
        for (index, text) in limits.iter().enumerate() {
            let (text, cost) = split_limit_argument(text)?;
            costs.push(cost);
            let limit = self.single(text)?.limits().next().map(|(_, limit)| limit.clone());
            named.push((index.to_string(), limit.ok_or(CallError::Malformed("no limit"))?));
        }
        let policy = Policy::spread(named)?;
        let request = request(head, costs, now)?;
        decide_policy(keyspace, keys, head, &policy, &request, now, reply, outbox)
    }
}

/// Decides `request` over `policy`, whose limit `i` is kept at `keys[i]`,
/// and appends the reply; adds the alert thresholds it crosses to
/// `outbox`, when given.
#[allow(clippy::too_many_arguments)]
fn decide_policy(
    keyspace: &mut impl Keyspace,
    keys: &[&[u8]],
    head: &Head,
    policy: &Policy,
    request: &Request,
    now: u64,
    reply: &mut Vec<i64>,
    outbox: Option<&Outbox<'_>>,
) -> Result<(), CallError> {
    // Each key as its limit reads it: whole, or (a sorted set that grows
    // with traffic) the members this decision needs.
    let action = Policy::action(&request.op);
    let mut values: Inline<Value> = SmallVec::with_capacity(keys.len());
    let mut partial: Inline<bool> = SmallVec::with_capacity(keys.len());
    for (index, (key, (_, limit))) in keys.iter().zip(policy.limits()).enumerate() {
        let members = limit.fetch(keyspace, key, now, action, request.cost_of(index));
        partial.push(members.is_some());
        values.push(members.map_or_else(|| keyspace.read(key), Value::Zset));
    }
    let mut states: Inline<Option<State>> = SmallVec::with_capacity(values.len());
    for ((_, limit), value) in policy.limits().zip(&values) {
        match limit.load(value, now) {
            Loaded::None => states.push(None),
            Loaded::State(state) => states.push(Some(state)),
            Loaded::Foreign => {
                push_head(reply, FOREIGN, 0, now);
                return Ok(());
            }
        }
    }
    if policy.limits().any(|(_, limit)| !limit.decides_at(now)) {
        return Err(CallError::PeriodsAway);
    }
    let held: Inline<Option<&State>> = states.iter().map(Option::as_ref).collect();
    let mut writes: Inline<_> = SmallVec::new();
    policy.validate(request)?;
    let outcome = policy.decide_validated(&held, now, request, |index, change, ttl| {
        writes.push((index, change, ttl));
    });
    drop(held);
    let explicit_now = head.now.is_some();
    for (index, change, ttl) in writes {
        let key = keys[index];
        // A set read in part that still holds ended entries not trimmed
        // is never dropped whole: it stays, to go in steps.
        let backlog = match (&states[index], policy.limits().nth(index)) {
            (Some(state), Some((_, limit))) if ttl == 0 && partial[index] => limit.backlog(state, now),
            _ => 0,
        };
        if ttl == 0 && backlog == 0 {
            keyspace.command(&[b"UNLINK", key]);
            continue;
        }
        let ttl = ttl.max(backlog);
        let mut old = &values[index];
        let state = if let Some(mut state) = states[index].take() {
            change.apply(&mut state);
            Some(state)
        } else {
            if partial[index] {
                // A set read in part that held no state (lapsed, or
                // another algorithm's): replaced whole.
                keyspace.command(&[b"UNLINK", key]);
                old = &Value::Missing;
            }
            change.into_state()
        };
        let limit = policy.limits().nth(index).map(|(_, limit)| limit);
        let Some(encoded) = state
            .zip(limit)
            .and_then(|(state, limit)| limit.encode(&state, now + ttl))
        else {
            continue;
        };
        write(keyspace, key, old, encoded, expire_ms(ttl, explicit_now));
    }
    let decisions: Inline<&Decision> = if outcome.limits.is_empty() {
        smallvec::smallvec![&outcome.decision]
    } else {
        outcome.limits.iter().map(|(_, decision)| decision).collect()
    };
    // A refund is never refused: it gives back what it was asked to.
    let (allowed, granted) = if head.op == OpCode::Refund {
        (true, head.cost)
    } else {
        (decisions.iter().all(|decision| decision.allowed), outcome.granted)
    };
    if let Some(outbox) = outbox {
        for crossing in &outcome.crossed {
            emit(keyspace, outbox, keys[crossing.index], crossing, now);
        }
    }
    push_head(reply, if allowed { ALLOWED } else { DENIED }, granted, now);
    for (index, (decision, (_, limit))) in decisions.into_iter().zip(policy.limits()).enumerate() {
        push_limit(reply, decision, Crossing::mask(&outcome.crossed, index, limit.alerts()));
    }
    Ok(())
}

/// Adds `crossing` of the limit kept at `key` to `outbox`: one entry of
/// the key, the limit's label, the threshold, the units used and the limit,
/// when the use resets and when it crossed (µs), as the Lua's `emit`.
fn emit(keyspace: &mut impl Keyspace, outbox: &Outbox<'_>, key: &[u8], crossing: &Crossing, now: u64) {
    let label = outbox.labels.get(crossing.index).copied().unwrap_or_default();
    let number = |n: u64| itoa::Buffer::new().format(n).as_bytes().to_vec();
    let reset_at = now.saturating_add(u64::try_from(crossing.reset_after.as_micros()).unwrap_or(u64::MAX));
    let (threshold, used, limit, reset_at, at) = (
        number(u64::from(crossing.threshold)),
        number(crossing.used),
        number(crossing.limit),
        number(reset_at),
        number(now),
    );
    keyspace.command(&[
        b"XADD",
        outbox.stream,
        b"MAXLEN",
        b"~",
        outbox.max_len,
        b"*",
        b"key",
        key,
        b"label",
        label,
        b"threshold",
        &threshold,
        b"used",
        &used,
        b"limit",
        &limit,
        b"reset_at",
        &reset_at,
        b"at",
        &at,
    ]);
}

/// Fields or members by name, to compare a value with the one it replaces.
type Index<'a, V> = HashMap<&'a [u8], V, foldhash::fast::RandomState>;

/// Writes `encoded` over `old`, the value it replaces: a string whole, a
/// hash or sorted set only where it differs (the whole of it over a value of
/// another type), then its expiry. A sorted set read in part changes only
/// where it was read: what the state leaves out of the members read goes.
fn write(keyspace: &mut impl Keyspace, key: &[u8], old: &Value, encoded: Encoded, expire_ms: u64) {
    let ms = itoa::Buffer::new().format(expire_ms).as_bytes().to_vec();
    match encoded {
        Encoded::String(value) => keyspace.set(key, &value, expire_ms),
        Encoded::Hash(fields) => {
            let old = match old {
                Value::Hash(old) => old.as_slice(),
                Value::Missing => &[],
                _ => {
                    keyspace.command(&[b"UNLINK", key]);
                    &[]
                }
            };
            let new: Index<&[u8]> = fields.iter().map(|(f, v)| (f.as_slice(), v.as_slice())).collect();
            let gone: Vec<&[u8]> = old
                .iter()
                .filter(|(field, _)| !new.contains_key(field.as_slice()))
                .map(|(field, _)| field.as_slice())
                .collect();
            if !gone.is_empty() {
                let mut args: Vec<&[u8]> = vec![b"HDEL", key];
                args.extend(gone);
                keyspace.command(&args);
            }
            let kept: Index<&[u8]> = old.iter().map(|(f, v)| (f.as_slice(), v.as_slice())).collect();
            let mut args: Vec<&[u8]> = vec![b"HSET", key];
            for (field, value) in &fields {
                if kept.get(field.as_slice()) != Some(&value.as_slice()) {
                    args.push(field);
                    args.push(value);
                }
            }
            if args.len() > 2 {
                keyspace.command(&args);
            }
            keyspace.command(&[b"PEXPIRE", key, &ms]);
        }
        Encoded::Zset(members) => {
            let old = match old {
                Value::Zset(old) => old.as_slice(),
                Value::Missing => &[],
                _ => {
                    keyspace.command(&[b"UNLINK", key]);
                    &[]
                }
            };
            let new: Index<i64> = members.iter().map(|(m, s)| (m.as_slice(), *s)).collect();
            // A figure the fetch computed is no member of the set.
            let gone: Vec<&[u8]> = old
                .iter()
                .filter(|(member, _)| !new.contains_key(member.as_slice()) && !member.starts_with(DERIVED))
                .map(|(member, _)| member.as_slice())
                .collect();
            if !gone.is_empty() {
                let mut args: Vec<&[u8]> = vec![b"ZREM", key];
                args.extend(gone);
                keyspace.command(&args);
            }
            let kept: Index<i64> = old.iter().map(|(m, s)| (m.as_slice(), *s)).collect();
            let scores: Vec<(Vec<u8>, &[u8])> = members
                .iter()
                .filter(|(member, score)| kept.get(member.as_slice()) != Some(score))
                .map(|(member, score)| {
                    (
                        itoa::Buffer::new().format(*score).as_bytes().to_vec(),
                        member.as_slice(),
                    )
                })
                .collect();
            if !scores.is_empty() {
                let mut args: Vec<&[u8]> = vec![b"ZADD", key];
                for (score, member) in &scores {
                    args.push(score);
                    args.push(member);
                }
                keyspace.command(&args);
            }
            keyspace.command(&[b"PEXPIRE", key, &ms]);
        }
    }
}
