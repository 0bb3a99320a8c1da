//! How a state is kept in a Redis key, for the native engine (the Redis
//! module): the value a key holds as the engine reads it ([`Value`]), a
//! sorted set read a few members at a time ([`SortedSet`]), what a load
//! makes of it ([`Loaded`]), and the value a state is written as
//! ([`Encoded`]). Each algorithm reads and writes exactly the encoding of
//! its Lua version (described at the top of its `.lua` file), so a key written
//! by one engine is read exactly by the other. This module knows none of
//! the algorithms.

use super::rate::Tat;

/// A key's value as the engine read it: whole, or a sorted set in part.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Value {
    /// No such key.
    #[default]
    Missing,
    /// A string.
    String(Vec<u8>),
    /// A hash: its fields and values, in no order.
    Hash(Vec<(Vec<u8>, Vec<u8>)>),
    /// A sorted set: its members and their (integer) scores, lowest score
    /// first (members of equal scores in byte order), as `ZRANGE … WITHSCORES`;
    /// all of them, or those one decision reads (see `Algorithm::fetch`).
    Zset(Members),
    /// A key of another type (a list, a stream…).
    Other,
}

impl Value {
    /// The string, when the key holds one.
    pub fn as_string(&self) -> Option<&[u8]> {
        match self {
            Value::String(value) => Some(value),
            _ => None,
        }
    }
}

/// A key's sorted set, read a few members at a time: how an algorithm whose
/// state is a sorted set reads only the members one decision needs
/// (`Algorithm::fetch`), so that its cost does not grow with the set.
/// Scores are integers, as Tollgate writes them.
pub trait SortedSet {
    /// Whether `key` holds a sorted set.
    fn is_sorted_set(&mut self, key: &[u8]) -> bool;

    /// The score of `member` in the sorted set at `key`, if it has one.
    fn score(&mut self, key: &[u8], member: &[u8]) -> Option<i64>;

    /// Visits the members of the sorted set at `key` whose scores lie in
    /// `scores`, lowest first (highest first when `reverse`; members of one
    /// score in byte order, or reversed), while `visit` returns true.
    /// `visit` is given each member, its score, and the score of any other
    /// member of the set on asking.
    fn scan(&mut self, key: &[u8], scores: Scores, reverse: bool, visit: &mut Visit<'_>);

    /// How many members of the sorted set at `key` have scores in `scores`
    /// (`ZCOUNT`: O(log n)).
    fn count(&mut self, key: &[u8], scores: Scores) -> u64;

    /// Appends to `members` the first `most` (at least one) members of the
    /// sorted set at `key` in `scores`, in the order of [`SortedSet::scan`].
    fn read_into(&mut self, key: &[u8], scores: Scores, reverse: bool, most: usize, members: &mut Members) {
        let mut left = most;
        self.scan(key, scores, reverse, &mut |member, score, _| {
            members.push((member.to_vec(), score));
            left = left.saturating_sub(1);
            left > 0
        });
    }
}

/// What [`SortedSet::scan`] calls for each member visited: given the
/// member, its score and a reader of any other member's score, it says
/// whether to go on.
pub type Visit<'a> = dyn FnMut(&[u8], i64, &mut dyn FnMut(&[u8]) -> Option<i64>) -> bool + 'a;

/// A range of scores, each end included or not (`None`: unbounded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scores {
    /// The lowest score, and whether it is included.
    pub from: Option<(i64, bool)>,
    /// The highest score, and whether it is included.
    pub to: Option<(i64, bool)>,
}

impl Scores {
    /// Every score.
    pub const ALL: Scores = Scores { from: None, to: None };

    /// Scores of `from` or more.
    pub(crate) fn from(from: i64) -> Self {
        Scores {
            from: Some((from, true)),
            to: None,
        }
    }

    /// Scores above `above`.
    pub(crate) fn above(above: i64) -> Self {
        Scores {
            from: Some((above, false)),
            to: None,
        }
    }

    /// Scores below `below`.
    pub(crate) fn below(below: i64) -> Self {
        Scores {
            from: None,
            to: Some((below, false)),
        }
    }

    /// Scores above `above`, up to `to` included.
    pub(crate) fn between(above: i64, to: i64) -> Self {
        Scores {
            from: Some((above, false)),
            to: Some((to, true)),
        }
    }
}

/// Members of a sorted set and their scores.
pub type Members = Vec<(Vec<u8>, i64)>;

/// The prefix of a member a fetch adds to those it read: a figure it
/// computed for the load, never stored (a write leaves it alone). No
/// algorithm stores a member starting with it.
pub(crate) const DERIVED: &[u8] = b"\0=";

/// `members` in the set's order (by score, then by bytes), each once: what
/// a load reads, however the members were gathered.
pub(crate) fn in_set_order(mut members: Members) -> Members {
    members.sort_unstable_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    members.dedup();
    members
}

/// What loading a key's value for one limit gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Loaded<S> {
    /// No state: none stored, one that has lapsed, or another algorithm's.
    None,
    /// The state.
    State(S),
    /// A string no algorithm writes: the key was not written by Tollgate,
    /// and the decision is refused.
    Foreign,
}

impl<S> Loaded<S> {
    /// The state, mapped.
    pub(crate) fn map<T>(self, f: impl FnOnce(S) -> T) -> Loaded<T> {
        match self {
            Loaded::None => Loaded::None,
            Loaded::State(state) => Loaded::State(f(state)),
            Loaded::Foreign => Loaded::Foreign,
        }
    }
}

/// A state as written: the key's whole new value. A writer compares it with
/// the value it replaces, so that a set or hash only changes where it differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Encoded {
    /// A string.
    String(Vec<u8>),
    /// A hash's fields and values.
    Hash(Vec<(Vec<u8>, Vec<u8>)>),
    /// A sorted set's members and scores.
    Zset(Vec<(Vec<u8>, i64)>),
}

/// A string of some algorithm's state (another one's, when the caller did
/// not recognise it) counts as none; anything else is foreign. The Lua
/// `other_state`: `^[filrs]?%d+:?%d*:?%d*$`, `^i%-%d+:%d+:%d+$` (a token
/// bucket in debt) or `^-%d%d%d%d+$`.
pub(crate) fn other_state<S>(value: &[u8]) -> Loaded<S> {
    fn digits(text: &[u8]) -> usize {
        text.iter().take_while(|byte| byte.is_ascii_digit()).count()
    }
    if let [b'-', rest @ ..] = value {
        return if rest.len() >= 4 && digits(rest) == rest.len() {
            Loaded::None
        } else {
            Loaded::Foreign
        };
    }
    let mut rest = match value {
        [b'i', b'-', rest @ ..] => return numbers::<3>(rest).map_or(Loaded::Foreign, |_| Loaded::None),
        [b'f' | b'i' | b'l' | b'r' | b's', rest @ ..] => rest,
        _ => value,
    };
    let leading = digits(rest);
    if leading == 0 {
        return Loaded::Foreign;
    }
    rest = &rest[leading..];
    // Up to two more groups, each an optional ':' then optional digits.
    for _ in 0..2 {
        if let [b':', tail @ ..] = rest {
            rest = tail;
        }
        rest = &rest[digits(rest)..];
    }
    if rest.is_empty() {
        Loaded::None
    } else {
        Loaded::Foreign
    }
}

/// How an algorithm keeps a TAT (see `tat_encoding` in the Lua prelude):
/// `<tag><at>` or `<tag><at>:<frac>`, or, for GCRA (empty tag) when a
/// microsecond holds at most [`PACKED_TICKS`] ticks, `-<at><frac in 3 digits>`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TatEncoding {
    /// The one-letter tag (empty for GCRA).
    pub tag: &'static [u8],
    /// Whether a fraction may be packed into one integer.
    pub packed: bool,
}

/// Ticks per microsecond up to which GCRA packs its fraction.
const PACKED_TICKS: u64 = 1000;

impl TatEncoding {
    /// The TAT in `value` (Lua `load_tat`): none when it has passed, when the
    /// key holds no string, or when the string is another algorithm's.
    pub(crate) fn load(self, value: &Value, now: u64) -> Loaded<Tat> {
        let Some(value) = value.as_string() else {
            return Loaded::None;
        };
        let Some(tat) = self.parse(value) else {
            return other_state(value);
        };
        if tat.at + u64::from(tat.frac > 0) <= now {
            return Loaded::None;
        }
        Loaded::State(tat)
    }

    fn parse(self, value: &[u8]) -> Option<Tat> {
        if self.packed {
            if let [b'-', packed @ ..] = value {
                let split = packed.len().checked_sub(3).filter(|&at| at > 0)?;
                let (at, frac) = packed.split_at(split);
                return Some(Tat {
                    at: number(at)?,
                    frac: number(frac)?,
                });
            }
        }
        let rest = value.strip_prefix(self.tag)?;
        match rest.iter().position(|&byte| byte == b':') {
            None => Some(Tat {
                at: number(rest)?,
                frac: 0,
            }),
            Some(colon) => {
                let frac = &rest[colon + 1..];
                Some(Tat {
                    at: number(&rest[..colon])?,
                    frac: if frac.is_empty() { 0 } else { number(frac)? },
                })
            }
        }
    }

    /// The value `tat` is written as (Lua `store_tat`), for a rate of
    /// `per_micro` ticks per microsecond.
    pub(crate) fn encode(self, tat: Tat, per_micro: u64) -> Encoded {
        let mut out = Vec::with_capacity(24);
        let mut digits = itoa::Buffer::new();
        if tat.frac == 0 {
            out.extend_from_slice(self.tag);
            out.extend_from_slice(digits.format(tat.at).as_bytes());
        } else if self.packed && per_micro <= PACKED_TICKS {
            out.push(b'-');
            out.extend_from_slice(digits.format(tat.at).as_bytes());
            let frac = digits.format(tat.frac).as_bytes();
            out.extend(std::iter::repeat_n(b'0', 3 - frac.len()));
            out.extend_from_slice(frac);
        } else {
            out.extend_from_slice(self.tag);
            out.extend_from_slice(digits.format(tat.at).as_bytes());
            out.push(b':');
            out.extend_from_slice(digits.format(tat.frac).as_bytes());
        }
        Encoded::String(out)
    }
}

/// The unsigned integer in `text` (ASCII digits only, no sign), or `None`.
pub(crate) fn number(text: &[u8]) -> Option<u64> {
    if text.is_empty() || text.len() > 19 {
        return None;
    }
    text.iter().try_fold(0u64, |n, &byte| {
        byte.is_ascii_digit().then(|| n * 10 + u64::from(byte - b'0'))
    })
}

/// The numbers of `text` split at `:` (each unsigned), or `None` when any
/// part is not one.
pub(crate) fn numbers<const N: usize>(text: &[u8]) -> Option<[u64; N]> {
    let mut out = [0; N];
    let mut parts = text.split(|&byte| byte == b':');
    for slot in &mut out {
        *slot = number(parts.next()?)?;
    }
    parts.next().is_none().then_some(out)
}

/// Integers below this are exact in a Lua number (a double): what a state
/// read back from Redis may hold.
pub(crate) const EXACT: u64 = 1 << 53;

/// An integer as text.
pub(crate) fn text(n: impl itoa::Integer) -> Vec<u8> {
    itoa::Buffer::new().format(n).as_bytes().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_state_accepts_every_tollgate_string_and_nothing_else() {
        for ours in [
            &b"123"[..],
            b"f10:2",
            b"i1:2:3",
            b"i-1:2:3",
            b"l5",
            b"r5:7",
            b"s5:",
            b"-12345",
            b"7::",
        ] {
            assert_eq!(
                other_state::<()>(ours),
                Loaded::None,
                "{:?}",
                String::from_utf8_lossy(ours)
            );
        }
        for foreign in [
            &b"hello"[..],
            b"",
            b"f",
            b"-123",
            b"1:2:3:4",
            b"x12",
            b"12a",
            b"-12a45",
            b"i-1:2",
            b"f-1:2",
        ] {
            assert_eq!(
                other_state::<()>(foreign),
                Loaded::Foreign,
                "{:?}",
                String::from_utf8_lossy(foreign)
            );
        }
    }

    #[test]
    fn tats_read_back_as_written() {
        let gcra = TatEncoding { tag: b"", packed: true };
        let reservation = TatEncoding {
            tag: b"r",
            packed: false,
        };
        for (encoding, tat, per_micro, written) in [
            (gcra, Tat { at: 100, frac: 0 }, 7, &b"100"[..]),
            (gcra, Tat { at: 100, frac: 5 }, 7, b"-100005"),
            (gcra, Tat { at: 100, frac: 5 }, 7000, b"100:5"),
            (reservation, Tat { at: 100, frac: 5 }, 7, b"r100:5"),
            (reservation, Tat { at: 100, frac: 0 }, 7, b"r100"),
        ] {
            assert_eq!(encoding.encode(tat, per_micro), Encoded::String(written.to_vec()));
            assert_eq!(encoding.load(&Value::String(written.to_vec()), 99), Loaded::State(tat));
        }
        // Passed, another algorithm's, foreign, not a string.
        assert_eq!(gcra.load(&Value::String(b"100".to_vec()), 100), Loaded::None);
        assert_eq!(
            gcra.load(&Value::String(b"-100005".to_vec()), 100),
            Loaded::State(Tat { at: 100, frac: 5 })
        );
        assert_eq!(gcra.load(&Value::String(b"-100005".to_vec()), 101), Loaded::None);
        assert_eq!(reservation.load(&Value::String(b"l100".to_vec()), 0), Loaded::None);
        assert_eq!(reservation.load(&Value::String(b"hello".to_vec()), 0), Loaded::Foreign);
        assert_eq!(gcra.load(&Value::Zset(Vec::new()), 0), Loaded::None);
    }

    #[test]
    fn numbers_split_at_colons() {
        assert_eq!(numbers::<2>(b"10:20"), Some([10, 20]));
        assert_eq!(numbers::<2>(b"10:20:30"), None);
        assert_eq!(numbers::<2>(b"10"), None);
        assert_eq!(numbers::<1>(b"-1"), None);
        assert_eq!(text(1234u64), b"1234");
        assert_eq!(text(-5i64), b"-5");
        assert_eq!(text(0u64), b"0");
    }
}
