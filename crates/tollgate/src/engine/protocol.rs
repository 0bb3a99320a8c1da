//! The calling convention between the Redis store and an engine (the Lua
//! functions library, or the native engine the Redis module runs): op
//! codes, a decision's head, the reply's layout and the version, written
//! once. The client encodes with it, the engine parses with it, and a test
//! holds the Lua library's copy of its numbers to it.
//!
//! Arguments are short texts, as Redis hands each to Lua as a string: a
//! head reads the same from call to call for requests of one shape (a
//! refund's instant is an argument of its own), so the library parses it
//! once and keeps it. The reply is integers only.
//!
//! One call (`FCALL <library> numkeys key… arg…`, or `TOLLGATE.DECIDE`
//! with the same keys and arguments):
//!
//! - keys: the keys of every limit of every decision, in order;
//! - arguments: the number of decisions, then per decision its [`Head`]
//!   and one [`limit_argument`] per limit;
//! - reply, per decision: [`REPLY_HEAD`] integers ([`push_head`]: status,
//!   granted, the instant decided at; all of a reset's reply and of a
//!   decision refused with [`FOREIGN`]), then [`REPLY_PER_LIMIT`] per limit
//!   ([`push_limit`]).
//!
//! Module and Lua clients share servers: a change to any of it is a new
//! [`PROTOCOL`].

use std::time::Duration;

use crate::algorithm::{Limit, LimitSpec};
use crate::clock::{micros, Timestamp};
use crate::decision::Decision;
use crate::request::Op;

/// The calling convention's version: the module answers it to
/// `TOLLGATE.VERSION`, and a client uses a module only when it is its own.
pub const PROTOCOL: i64 = 4;

/// Added to a limit's algorithm id (the first number of its
/// [`limit_argument`]) when a check it refuses still records its cost.
pub const RECORDS_OVERAGE: u64 = 128;

/// Added to a limit's algorithm id when it alerts: its parameters are then
/// followed by its thresholds and their count.
pub const ALERTS: u64 = 256;

/// The integers of a decision's reply before its limits': status, granted,
/// the instant decided at.
pub const REPLY_HEAD: usize = 3;

/// The integers of one limit's reply: allowed, limit, remaining,
/// retry_after (-1: never), reset_after, wait (durations in µs), and the
/// alert thresholds the decision crossed (bit `i`: the limit's `i`-th).
pub const REPLY_PER_LIMIT: usize = 7;

/// A decision's status: allowed.
pub const ALLOWED: i64 = 1;
/// A decision's status: denied.
pub const DENIED: i64 = 0;
/// A decision's status: refused, a key holding a value Tollgate did not
/// write (the reply is its head only).
pub const FOREIGN: i64 = -1;

/// A call an engine refuses: nothing is written for the decision at
/// fault (earlier decisions of its batch are made).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// Arguments not in the convention's shape; says what is wrong.
    #[error("{0}")]
    Malformed(&'static str),
    /// A number the convention wants unsigned that is not; names it.
    #[error("{0} is not an unsigned integer")]
    NotUnsigned(&'static str),
    /// An op code the convention does not have.
    #[error("unknown op {0}")]
    UnknownOp(u64),
    /// A limit's text that no algorithm reads: its id and how many
    /// numbers follow it.
    #[error("no algorithm {id} with {params} parameters")]
    UnknownLimit {
        /// The algorithm id.
        id: u64,
        /// The numbers after it.
        params: usize,
    },
    /// Limits or a request the library refuses, with its message.
    #[error("{0}")]
    Refused(String),
    /// A calendar window sent with periods that do not hold the server's
    /// time.
    #[error("a calendar window's periods do not hold the server's time (the client's clock is a period away)")]
    PeriodsAway,
}

impl From<crate::Error> for CallError {
    fn from(error: crate::Error) -> Self {
        Self::Refused(error.to_string())
    }
}

/// The largest number the convention carries: the reply's integers are
/// signed, and a longer wait is as good as forever.
const MAX_NUMBER: u64 = i64::MAX.cast_unsigned();

/// What a decision asks of its limits, as its head spells it.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpCode {
    /// [`Op::Check`].
    Check = 1,
    /// [`Op::CheckAtMost`].
    CheckAtMost = 2,
    /// [`Op::Reserve`].
    Reserve = 3,
    /// [`Op::Acquire`].
    Acquire = 4,
    /// [`Op::Release`].
    Release = 5,
    /// Deletes the limits' keys (`Store::reset`).
    Reset = 6,
    /// [`Op::Refund`].
    Refund = 7,
    /// [`Op::Record`].
    Record = 8,
}

impl OpCode {
    /// Every op, in the order of their codes.
    pub const ALL: [Self; 8] = [
        Self::Check,
        Self::CheckAtMost,
        Self::Reserve,
        Self::Acquire,
        Self::Release,
        Self::Reset,
        Self::Refund,
        Self::Record,
    ];

    /// The number that stands for it.
    pub const fn code(self) -> u64 {
        self as u64
    }

    /// The op `code` stands for.
    pub const fn from_code(code: u64) -> Option<Self> {
        match code {
            1 => Some(Self::Check),
            2 => Some(Self::CheckAtMost),
            3 => Some(Self::Reserve),
            4 => Some(Self::Acquire),
            5 => Some(Self::Release),
            6 => Some(Self::Reset),
            7 => Some(Self::Refund),
            8 => Some(Self::Record),
            _ => None,
        }
    }

    /// Whether the head is followed by a lease name (empty: none).
    pub const fn carries_lease(self) -> bool {
        matches!(self, Self::Acquire | Self::Release | Self::Refund)
    }

    /// Whether the lease name is followed by the instant (µs) the units
    /// given back were taken at.
    pub const fn carries_refund_instant(self) -> bool {
        matches!(self, Self::Refund)
    }

    /// How many integers the reply of a decision over `limits` limits
    /// holds (unless refused with [`FOREIGN`]: [`REPLY_HEAD`]).
    pub const fn reply_len(self, limits: usize) -> usize {
        match self {
            Self::Reset => REPLY_HEAD,
            _ => REPLY_HEAD + REPLY_PER_LIMIT * limits,
        }
    }
}

impl From<&Op> for OpCode {
    fn from(op: &Op) -> Self {
        match op {
            Op::Check => Self::Check,
            Op::CheckAtMost => Self::CheckAtMost,
            Op::Reserve { .. } => Self::Reserve,
            Op::Acquire { .. } => Self::Acquire,
            Op::Release { .. } => Self::Release,
            Op::Refund { .. } => Self::Refund,
            Op::Record => Self::Record,
        }
    }
}

/// The arguments of one decision before its limits': the text
/// `<op>:<cost>:<n>:<max_wait>:<now>`, then the lease name when the op
/// [carries one](OpCode::carries_lease), then the refund's instant when it
/// [carries one](OpCode::carries_refund_instant).
///
/// Its numbers are at most `i64::MAX`. `lease` and `refund_at` are sent
/// only for the ops that carry them: a head of another op parses back with
/// `None` and 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head<'a> {
    /// What the decision asks.
    pub op: OpCode,
    /// The request's cost.
    pub cost: u64,
    /// How many limits (and keys) the decision has.
    pub limits: usize,
    /// The longest acceptable wait, µs (`None`: any; written -1).
    pub max_wait: Option<u64>,
    /// The instant to decide at, µs (`None`: the server's time; written
    /// empty).
    pub now: Option<u64>,
    /// The lease name (`None`: none; written empty).
    pub lease: Option<&'a str>,
    /// A refund's instant, µs: when the units were taken.
    pub refund_at: u64,
    /// Whether the limits' arguments are followed by an outbox's: the
    /// stream the crossings of alert thresholds are added to, its length
    /// cap, and a label per limit (written `:1` after `now`).
    pub outbox: bool,
}

/// Where a decision writes the alert thresholds it crosses, in the same
/// call: a Redis Stream, capped near `max_len` entries, each entry with
/// the label of the limit that crossed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outbox<'a> {
    /// The stream's key.
    pub stream: &'a [u8],
    /// Its length cap (`XADD … MAXLEN ~`).
    pub max_len: &'a [u8],
    /// Per limit, what the entry carries to name it (empty: none).
    pub labels: &'a [&'a [u8]],
}

impl<'a> Head<'a> {
    /// The head of `op` at `cost` over `limits` limits, decided at `now`
    /// (µs; `None`: the server's time).
    pub fn new(op: &'a Op, cost: u64, limits: usize, now: Option<u64>) -> Self {
        let (max_wait, lease, refund_at) = match op {
            Op::Reserve { max_wait } => (*max_wait, None, 0),
            Op::Acquire { lease, max_wait } => (*max_wait, Some(lease.as_str()), 0),
            Op::Release { lease } => (None, Some(lease.as_str()), 0),
            Op::Refund { at, lease } => (None, lease.as_deref(), at.as_micros()),
            Op::Check | Op::CheckAtMost | Op::Record => (None, None, 0),
        };
        Self {
            op: OpCode::from(op),
            cost,
            limits,
            max_wait: max_wait.map(|wait| micros(wait).min(MAX_NUMBER)),
            now,
            lease,
            refund_at,
            outbox: false,
        }
    }

    /// The head of a reset of `limits` limits at `now` (µs; `None`: the
    /// server's time).
    pub fn reset(limits: usize, now: Option<u64>) -> Self {
        Self {
            op: OpCode::Reset,
            cost: 0,
            limits,
            max_wait: None,
            now,
            lease: None,
            refund_at: 0,
            outbox: false,
        }
    }

    /// Appends its arguments to `args`.
    pub fn encode<A: From<String>>(&self, args: &mut Vec<A>) {
        // Numbers written with itoa into strings sized once: a head is
        // built per decision, and `format!` was a tenth of the client's CPU.
        let mut text = String::with_capacity(64);
        push_number(&mut text, self.op.code());
        text.push(':');
        push_number(&mut text, self.cost);
        text.push(':');
        push_number(&mut text, self.limits);
        text.push(':');
        match self.max_wait {
            Some(max_wait) => push_number(&mut text, max_wait),
            None => text.push_str("-1"),
        }
        text.push(':');
        if let Some(now) = self.now {
            push_number(&mut text, now);
        }
        if self.outbox {
            text.push_str(":1");
        }
        args.push(A::from(text));
        if self.op.carries_lease() {
            args.push(A::from(self.lease.unwrap_or_default().to_owned()));
        }
        if self.op.carries_refund_instant() {
            let mut at = String::with_capacity(20);
            push_number(&mut at, self.refund_at);
            args.push(A::from(at));
        }
    }

    /// Takes a head's arguments off the front of `args`.
    ///
    /// # Errors
    ///
    /// Arguments that are no head, or too few of them.
    pub fn parse(args: &mut &[&'a [u8]]) -> Result<Self, CallError> {
        let mut next = |missing: &'static str| {
            let (&first, rest) = args.split_first().ok_or(CallError::Malformed(missing))?;
            *args = rest;
            Ok::<_, CallError>(first)
        };
        let text = next("a decision is missing")?;
        let malformed = || CallError::Malformed("a decision's head is <op>:<cost>:<n>:<max_wait>:<now>");
        let mut fields = text.split(|&byte| byte == b':');
        let mut field = || fields.next().ok_or_else(malformed);
        let (op, cost, limits, max_wait, now) = (field()?, field()?, field()?, field()?, field()?);
        let outbox = match fields.next() {
            None => false,
            Some(b"1") => true,
            Some(_) => return Err(malformed()),
        };
        if fields.next().is_some() {
            return Err(malformed());
        }
        let op = unsigned(op, "op")?;
        let op = OpCode::from_code(op).ok_or(CallError::UnknownOp(op))?;
        let lease = if op.carries_lease() {
            let lease = next("a lease is missing")?;
            let lease = std::str::from_utf8(lease).map_err(|_| CallError::Malformed("a lease name is not UTF-8"))?;
            (!lease.is_empty()).then_some(lease)
        } else {
            None
        };
        let refund_at = if op.carries_refund_instant() {
            unsigned(next("a refund's instant is missing")?, "a refund's instant")?
        } else {
            0
        };
        Ok(Self {
            op,
            cost: unsigned(cost, "cost")?,
            limits: usize::try_from(unsigned(limits, "the number of limits")?)
                .map_err(|_| CallError::Malformed("too many limits"))?,
            max_wait: if max_wait == b"-1" {
                None
            } else {
                Some(unsigned(max_wait, "max_wait")?)
            },
            now: if now.is_empty() {
                None
            } else {
                Some(unsigned(now, "now")?)
            },
            lease,
            refund_at,
            outbox,
        })
    }

    /// The op it asks (`None` for a reset, which is no request).
    pub fn request_op(&self) -> Option<Op> {
        let lease = self.lease.map(str::to_owned);
        let max_wait = self.max_wait.map(Duration::from_micros);
        Some(match self.op {
            OpCode::Check => Op::Check,
            OpCode::CheckAtMost => Op::CheckAtMost,
            OpCode::Reserve => Op::Reserve { max_wait },
            OpCode::Acquire => Op::Acquire {
                lease: lease.unwrap_or_default(),
                max_wait,
            },
            OpCode::Release => Op::Release {
                lease: lease.unwrap_or_default(),
            },
            OpCode::Refund => Op::Refund {
                at: Timestamp::from_micros(self.refund_at),
                lease,
            },
            OpCode::Record => Op::Record,
            OpCode::Reset => return None,
        })
    }
}

/// A limit's argument, `<id>:<parameters>:<cost>`, written once: its
/// algorithm's id (plus [`RECORDS_OVERAGE`] when a check it refuses still
/// counts, plus [`ALERTS`] when it alerts), the numbers its algorithm reads
/// for a decision near `now` (µs; asked only of a calendar window, whose
/// periods are the ones around it), its alert thresholds and their count
/// when it alerts, then the `cost` it sees. What is before the last ':' is
/// the limit's text, which [`read_limit_text`] reads back.
pub fn limit_argument(limit: &Limit, cost: u64, now: impl FnOnce() -> u64) -> String {
    let mut flag = if limit.records_overage() { RECORDS_OVERAGE } else { 0 };
    if !limit.alerts().is_empty() {
        flag += ALERTS;
    }
    let mut argument = String::with_capacity(64);
    push_number(&mut argument, u64::from(limit.id()) + flag);
    limit.each_param(now, |param| {
        argument.push(':');
        push_number(&mut argument, param);
    });
    if !limit.alerts().is_empty() {
        for &threshold in limit.alerts() {
            argument.push(':');
            push_number(&mut argument, u64::from(threshold));
        }
        argument.push(':');
        push_number(&mut argument, limit.alerts().len() as u64);
    }
    argument.push(':');
    push_number(&mut argument, cost);
    argument
}

/// The limit a [`limit_argument`]'s text (without its cost) describes.
///
/// # Errors
///
/// A text that is not numbers joined by ':', or whose numbers describe no
/// valid limit.
pub fn read_limit_text(text: &[u8]) -> Result<Limit, CallError> {
    let mut numbers = Vec::with_capacity(8);
    for part in text.split(|&byte| byte == b':') {
        numbers.push(unsigned(part, "a limit's parameter")?);
    }
    let (&flagged, mut params) = numbers.split_first().ok_or(CallError::Malformed("a limit has no id"))?;
    let (flagged, alerts) = if flagged >= ALERTS {
        let (&count, rest) = params.split_last().ok_or(CallError::Malformed("a limit's alerts"))?;
        let count = usize::try_from(count).unwrap_or(usize::MAX);
        let at = rest
            .len()
            .checked_sub(count)
            .ok_or(CallError::Malformed("a limit's alerts"))?;
        let (own, thresholds) = rest.split_at(at);
        params = own;
        (flagged - ALERTS, Some(thresholds))
    } else {
        (flagged, None)
    };
    let (id, records_overage) = if flagged >= RECORDS_OVERAGE {
        (flagged - RECORDS_OVERAGE, true)
    } else {
        (flagged, false)
    };
    let spec = LimitSpec::from_params(id, params).ok_or(CallError::UnknownLimit {
        id,
        params: params.len(),
    })?;
    let mut limit = spec.build()?;
    if records_overage {
        limit = limit.recording_overage()?;
    }
    if let Some(thresholds) = alerts {
        let thresholds = thresholds
            .iter()
            .map(|&threshold| u8::try_from(threshold).map_err(|_| CallError::Malformed("a limit's alerts")))
            .collect::<Result<Vec<u8>, CallError>>()?;
        limit = limit.alerting(thresholds)?;
    }
    Ok(limit)
}

/// A [`limit_argument`] split into its text and its cost.
///
/// # Errors
///
/// An argument without a cost.
pub fn split_limit_argument(argument: &[u8]) -> Result<(&[u8], u64), CallError> {
    let colon = argument
        .iter()
        .rposition(|&byte| byte == b':')
        .ok_or(CallError::Malformed("a limit is <id>:<params>:<cost>"))?;
    Ok((&argument[..colon], unsigned(&argument[colon + 1..], "a limit's cost")?))
}

/// Appends a decision's reply head.
pub fn push_head(reply: &mut Vec<i64>, status: i64, granted: u64, now: u64) {
    reply.extend([status, signed(granted), signed(now)]);
}

/// Appends one limit's reply: its decision and the mask of the alert
/// thresholds it crossed.
pub fn push_limit(reply: &mut Vec<i64>, decision: &Decision, crossed: i64) {
    let micros = |duration: Duration| i64::try_from(duration.as_micros()).unwrap_or(i64::MAX);
    reply.extend([
        i64::from(decision.allowed),
        signed(decision.limit),
        signed(decision.remaining),
        decision.retry_after.map_or(-1, micros),
        micros(decision.reset_after),
        micros(decision.wait),
        crossed,
    ]);
}

/// A decision's reply head, as [`push_head`] wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyHead {
    /// [`ALLOWED`], [`DENIED`] or [`FOREIGN`].
    pub status: i64,
    /// Units granted.
    pub granted: u64,
    /// The instant decided at, µs since the epoch.
    pub now: u64,
}

/// Reads a decision's reply head off the front of `reply`, and the rest
/// (`None`: fewer than [`REPLY_HEAD`] integers, or one out of its range).
pub fn read_head(reply: &[i64]) -> Option<(ReplyHead, &[i64])> {
    let (&[status, granted, now], rest) = reply.split_first_chunk::<REPLY_HEAD>()?;
    let head = ReplyHead {
        status,
        granted: u64::try_from(granted).ok()?,
        now: u64::try_from(now).ok()?,
    };
    Some((head, rest))
}

/// How many integers at the front of `reply` are one decision's reply:
/// `expected` ([`OpCode::reply_len`]), unless it was refused with
/// [`FOREIGN`] (its head only).
pub fn decision_reply_len(reply: &[i64], expected: usize) -> usize {
    if reply.first() == Some(&FOREIGN) {
        REPLY_HEAD
    } else {
        expected
    }
}

/// Reads one limit's reply, its decision and the mask of the alert
/// thresholds it crossed (`None`: not [`REPLY_PER_LIMIT`] integers, or one
/// out of its range).
pub fn read_limit(fields: &[i64]) -> Option<(Decision, i64)> {
    let &[allowed, limit, remaining, retry_after, reset_after, wait, crossed] = fields else {
        return None;
    };
    let decision = Decision {
        allowed: allowed == 1,
        limit: u64::try_from(limit).ok()?,
        remaining: u64::try_from(remaining).ok()?,
        retry_after: u64::try_from(retry_after).ok().map(Duration::from_micros),
        reset_after: Duration::from_micros(u64::try_from(reset_after).ok()?),
        wait: Duration::from_micros(u64::try_from(wait).ok()?),
    };
    Some((decision, crossed))
}

/// A reply as it goes over the wire: its integers as one bulk string of
/// 8-byte little-endian signed words (the Lua library and the module both
/// pack so: a client reads one string instead of a RESP integer per value).
pub fn pack(reply: &[i64]) -> Vec<u8> {
    let mut packed = Vec::with_capacity(8 * reply.len());
    for integer in reply {
        packed.extend_from_slice(&integer.to_le_bytes());
    }
    packed
}

/// The integers of a [`pack`]ed reply (`None`: not a whole number of words).
pub fn unpack(packed: &[u8]) -> Option<Vec<i64>> {
    if !packed.len().is_multiple_of(8) {
        return None;
    }
    let words = packed.chunks_exact(8).map(|word| {
        let mut le = [0; 8];
        le.copy_from_slice(word);
        i64::from_le_bytes(le)
    });
    Some(words.collect())
}

/// `number` as a reply's integer.
fn signed(number: u64) -> i64 {
    i64::try_from(number).unwrap_or(i64::MAX)
}

/// Appends `number` in decimal.
fn push_number(text: &mut String, number: impl itoa::Integer) {
    text.push_str(itoa::Buffer::new().format(number));
}

/// `text` as an unsigned integer, or an error naming `field`.
pub(super) fn unsigned(text: &[u8], field: &'static str) -> Result<u64, CallError> {
    crate::algorithm::number(text).ok_or(CallError::NotUnsigned(field))
}

#[cfg(test)]
mod tests;
