//! Worked examples: every algorithm driven through the public API on explicit
//! instants (or a manual clock), each decision compared whole against values
//! computed by hand. The arithmetic sits beside each assertion.
//!
//! Notation in the comments: `T` is an emission interval (`period / rate`),
//! times are µs since the Unix epoch, and a rate of `r` per `p` µs is counted
//! in ticks as the library does (one unit weighs `p / g` ticks, one µs drains
//! `r / g` ticks, `g = gcd(r, p)`), so that 7 per second is exact.

// Worked examples read best as one trace per test, top to bottom.
#![allow(clippy::too_many_lines)]

use std::time::Duration;

use tollgate::Clock as _;
use tollgate::{
    Acquired, Decision, ErrorKind, Limit, LimitSpec, Limiter, ManualClock, MemoryStore, Op, Outcome, Policy, Refill,
    Request, ReservationSpec, Subject, Timestamp, TokenBucketSpec,
};

const SECOND: u64 = 1_000_000;
const HOUR: u64 = 3_600 * SECOND;

/// A decision in whole microseconds, compared as one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct D {
    allowed: bool,
    limit: u64,
    remaining: u64,
    retry_after: Option<u64>,
    reset_after: u64,
    wait: u64,
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).expect("durations in these tests fit in u64")
}

impl D {
    fn of(decision: &Decision) -> Self {
        Self {
            allowed: decision.allowed,
            limit: decision.limit,
            remaining: decision.remaining,
            retry_after: decision.retry_after.map(micros),
            reset_after: micros(decision.reset_after),
            wait: micros(decision.wait),
        }
    }
}

/// Admitted: `retry_after` is zero.
const fn allow(limit: u64, remaining: u64, reset_after: u64, wait: u64) -> D {
    D {
        allowed: true,
        limit,
        remaining,
        retry_after: Some(0),
        reset_after,
        wait,
    }
}

/// Denied for now: admitted after `retry_after`.
const fn deny(limit: u64, remaining: u64, retry_after: u64, reset_after: u64) -> D {
    D {
        allowed: false,
        limit,
        remaining,
        retry_after: Some(retry_after),
        reset_after,
        wait: 0,
    }
}

/// Denied for ever: the cost is above what the limit can ever admit.
const fn never(limit: u64, remaining: u64, reset_after: u64) -> D {
    D {
        allowed: false,
        limit,
        remaining,
        retry_after: None,
        reset_after,
        wait: 0,
    }
}

fn at(t: u64) -> Timestamp {
    Timestamp::from_micros(t)
}

/// One subject of one limiter on a fresh memory store, decided at explicit instants.
struct Trace {
    limiter: Limiter,
    subject: Subject,
}

impl Trace {
    fn new(policy: impl Into<Policy>) -> Self {
        Self {
            limiter: Limiter::in_memory(policy),
            subject: Subject::new("203.0.113.7").and("/login"),
        }
    }

    async fn outcome(&self, t: u64, op: Op, cost: u64) -> Outcome {
        let request = Request::new(op, cost).at(at(t));
        self.limiter
            .decide(&self.subject, &request)
            .await
            .expect("a valid request on the memory store")
    }

    async fn check(&self, t: u64, cost: u64) -> D {
        D::of(&self.outcome(t, Op::Check, cost).await.decision)
    }

    async fn peek(&self, t: u64) -> D {
        self.check(t, 0).await
    }

    async fn reserve(&self, t: u64, cost: u64, max_wait: Option<u64>) -> D {
        let op = Op::Reserve {
            max_wait: max_wait.map(Duration::from_micros),
        };
        D::of(&self.outcome(t, op, cost).await.decision)
    }

    async fn acquire(&self, t: u64, lease: &str, cost: u64) -> Outcome {
        let op = Op::Acquire {
            lease: lease.to_owned(),
            max_wait: None,
        };
        self.outcome(t, op, cost).await
    }

    async fn release(&self, t: u64, lease: &str) -> D {
        let op = Op::Release {
            lease: lease.to_owned(),
        };
        D::of(&self.outcome(t, op, 0).await.decision)
    }
}

fn named(outcome: &Outcome) -> Vec<(&str, D)> {
    outcome
        .limits
        .iter()
        .map(|(name, decision)| (name.as_str(), D::of(decision)))
        .collect()
}

// ---------------------------------------------------------------------------
// fixed_window

#[tokio::test]
async fn fixed_window_is_aligned_to_the_epoch() {
    let trace = Trace::new(Limit::fixed_window(3, Duration::from_secs(1)).unwrap());
    // Nothing counted yet: full, and nothing to reset.
    assert_eq!(trace.peek(1_500_000).await, allow(3, 3, 0, 0));
    // 1.5 s lies in the window [1 s, 2 s): count 1, remaining 3 − 1 = 2,
    // reset_after = 2_000_000 − 1_500_000 = 500 ms (not a full second).
    assert_eq!(trace.check(1_500_000, 1).await, allow(3, 2, 500_000, 0));
    // Cost 2: count 3, remaining 0, reset_after = 2_000_000 − 1_700_000.
    assert_eq!(trace.check(1_700_000, 2).await, allow(3, 0, 300_000, 0));
    // Full: denied until the window ends, 2_000_000 − 1_800_000 = 200 ms.
    assert_eq!(trace.check(1_800_000, 1).await, deny(3, 0, 200_000, 200_000));
    // One µs before the boundary: retry_after = 1 µs.
    assert_eq!(trace.check(1_999_999, 1).await, deny(3, 0, 1, 1));
    // The next window [2 s, 3 s) starts from zero: count 1, remaining 2,
    // reset_after = 3_000_000 − 2_000_000.
    assert_eq!(trace.check(2_000_000, 1).await, allow(3, 2, 1_000_000, 0));
    // A peek changes nothing: still remaining 2; 3_000_000 − 2_250_000 = 750 ms.
    assert_eq!(trace.peek(2_250_000).await, allow(3, 2, 750_000, 0));
    // Cost 4 > limit 3: never, and nothing consumed.
    assert_eq!(trace.check(2_250_000, 4).await, never(3, 2, 750_000));
    // The boundary burst the docs warn of: 3 units in [1.5 s, 2 s) and now 3
    // in [2 s, 2.25 s] — 6 within 750 ms.
    assert_eq!(trace.check(2_250_000, 2).await, allow(3, 0, 750_000, 0));
}

// ---------------------------------------------------------------------------
// sliding_window

#[tokio::test]
async fn sliding_window_counts_the_oldest_partial_bucket_whole() {
    // 4 per second in 4 buckets: sub-interval = 250 ms; the units of
    // sub-interval i count until (i + 4 + 1) · 250 ms.
    let trace = Trace::new(Limit::sliding_window(4, Duration::from_secs(1), 4).unwrap());
    // t = 100 ms is in sub-interval 0: counts [(0, 2)], remaining 2,
    // reset_after = (0 + 5) · 250_000 − 100_000 = 1_150_000.
    assert_eq!(trace.check(100_000, 2).await, allow(4, 2, 1_150_000, 0));
    // t = 600 ms, sub-interval 2: counts [(0,2), (2,2)], remaining 0,
    // reset_after = (2 + 5) · 250_000 − 600_000 = 1_150_000.
    assert_eq!(trace.check(600_000, 2).await, allow(4, 0, 1_150_000, 0));
    // t = 1.1 s, sub-interval 4: the oldest live one is 4 − 4 = 0, so the two
    // units of t = 100 ms still count, although 1 s has passed. One unit must
    // leave: sub-interval 0 leaves at 1_250_000 → retry 150 ms;
    // reset_after = 1_750_000 − 1_100_000 = 650 ms.
    assert_eq!(trace.check(1_100_000, 1).await, deny(4, 0, 150_000, 650_000));
    // Still sub-interval 4 (1_249_999 / 250_000 = 4): 1 µs to go.
    assert_eq!(trace.check(1_249_999, 1).await, deny(4, 0, 1, 500_001));
    // t = 1.25 s, sub-interval 5: sub-interval 0 has left, live [(2,2)],
    // total 2, remaining 2 → admitted, [(2,2), (5,1)], remaining 1,
    // reset_after = (5 + 5) · 250_000 − 1_250_000 = 1_250_000.
    assert_eq!(trace.check(1_250_000, 1).await, allow(4, 1, 1_250_000, 0));
    // Cost 3 needs 3 + 3 − 4 = 2 units to leave: sub-interval 2 (2 units)
    // leaves at 7 · 250_000 = 1_750_000 → retry 500 ms.
    assert_eq!(trace.check(1_250_000, 3).await, deny(4, 1, 500_000, 1_250_000));
    // Cost 5 > 4: never.
    assert_eq!(trace.check(1_250_000, 5).await, never(4, 1, 1_250_000));
    // At exactly 1.75 s (sub-interval 7, oldest live 3) the retry succeeds:
    // live [(5,1)], remaining 3 → [(5,1), (7,3)], remaining 0,
    // reset_after = (7 + 5) · 250_000 − 1_750_000 = 1_250_000.
    assert_eq!(trace.check(1_750_000, 3).await, allow(4, 0, 1_250_000, 0));
    // t = 2_999_999, sub-interval 11, oldest live 7: (5,1) has left,
    // remaining 4 − 3 = 1, reset_after = 3_000_000 − 2_999_999.
    assert_eq!(trace.peek(2_999_999).await, allow(4, 1, 1, 0));
    // At 3 s sub-interval 7 has left too: untouched.
    assert_eq!(trace.peek(3_000_000).await, allow(4, 4, 0, 0));
}

// ---------------------------------------------------------------------------
// sliding_log

#[tokio::test]
async fn sliding_log_is_exact() {
    let trace = Trace::new(Limit::sliding_log(3, Duration::from_secs(1)).unwrap());
    // [(100 ms, 1)]: remaining 2, reset_after = 100_000 + 1 s − 100_000.
    assert_eq!(trace.check(100_000, 1).await, allow(3, 2, 1_000_000, 0));
    // [(100 ms,1), (400 ms,2)]: remaining 0, reset_after = 1_400_000 − 400_000.
    assert_eq!(trace.check(400_000, 2).await, allow(3, 0, 1_000_000, 0));
    // One unit must leave: the entry of 100 ms leaves at 1_100_000 → retry
    // 1_100_000 − 900_000 = 200 ms; reset_after = 1_400_000 − 900_000.
    assert_eq!(trace.check(900_000, 1).await, deny(3, 0, 200_000, 500_000));
    // Two units must leave: 1 (at 100 ms) is not enough, 1 + 2 (at 400 ms)
    // is → retry 1_400_000 − 900_000 = 500 ms.
    assert_eq!(trace.check(900_000, 2).await, deny(3, 0, 500_000, 500_000));
    // 1 µs before the oldest entry leaves.
    assert_eq!(trace.check(1_099_999, 1).await, deny(3, 0, 1, 300_001));
    // Exactly one window after 100 ms it has left (no partial bucket here):
    // live [(400 ms,2)] → [(400 ms,2), (1.1 s,1)], remaining 0,
    // reset_after = 1_100_000 + 1 s − 1_100_000.
    assert_eq!(trace.check(1_100_000, 1).await, allow(3, 0, 1_000_000, 0));
    // At 1.4 s the entry of 400 ms leaves: live [(1.1 s,1)], remaining 2 →
    // cost 2 fits: [(1.1 s,1), (1.4 s,2)], remaining 0.
    assert_eq!(trace.check(1_400_000, 2).await, allow(3, 0, 1_000_000, 0));
    // Peek: reset_after = 1_400_000 + 1 s − 1_500_000 = 900 ms.
    assert_eq!(trace.peek(1_500_000).await, allow(3, 0, 900_000, 0));
    // At 2.1 s the entry of 1.1 s leaves: remaining 1, reset_after =
    // 2_400_000 − 2_100_000.
    assert_eq!(trace.peek(2_100_000).await, allow(3, 1, 300_000, 0));
}

// ---------------------------------------------------------------------------
// token_bucket

fn token_bucket(capacity: u64, refill: u64, interval: Duration, mode: Refill, initial: Option<u64>) -> Limit {
    LimitSpec::TokenBucket(TokenBucketSpec {
        capacity,
        refill,
        interval,
        mode,
        initial,
        max_debt: None,
    })
    .build()
    .unwrap()
}

#[tokio::test]
async fn token_bucket_smooth_and_interval_differ_on_the_same_trace() {
    // Capacity 4, 2 tokens per second. Smooth: one token every 500 ms,
    // continuously (1 token = 500_000 ticks, 1 tick per µs). Interval: 2 whole
    // tokens at each multiple of 1 s since the epoch.
    let smooth = Trace::new(token_bucket(4, 2, Duration::from_secs(1), Refill::Smooth, None));
    let interval = Trace::new(token_bucket(4, 2, Duration::from_secs(1), Refill::Interval, None));
    let mut admitted = [0, 0];

    // 10.3 s, cost 4: both full, both emptied.
    // Smooth: full again after 4 · 500 ms = 2 s.
    assert_eq!(smooth.check(10_300_000, 4).await, allow(4, 0, 2_000_000, 0));
    // Interval: 4 missing tokens need ⌈4 / 2⌉ = 2 boundaries: 12 s − 10.3 s.
    assert_eq!(interval.check(10_300_000, 4).await, allow(4, 0, 1_700_000, 0));
    admitted[0] += 4;
    admitted[1] += 4;

    // 10.8 s, cost 1.
    // Smooth: 500 ms have refilled exactly one token (full at 12.3 s, deficit
    // 1.5 s = 3 tokens missing) → admitted, full again at 12.8 s.
    assert_eq!(smooth.check(10_800_000, 1).await, allow(4, 0, 2_000_000, 0));
    admitted[0] += 1;
    // Interval: no boundary since 10.3 s → 0 tokens; the next arrives at 11 s
    // (retry 200 ms), full at 12 s (reset 1.2 s).
    assert_eq!(interval.check(10_800_000, 1).await, deny(4, 0, 200_000, 1_200_000));

    // 11 s, cost 2.
    // Smooth: full at 12.8 s → 1.8 s = 3.6 tokens missing, 0.4 present;
    // 2 tokens are there at 11.8 s → retry 800 ms; reset_after 1.8 s.
    assert_eq!(smooth.check(11_000_000, 2).await, deny(4, 0, 800_000, 1_800_000));
    // Interval: boundary 11 added 2 tokens → admitted, 0 left, full at 13 s.
    assert_eq!(interval.check(11_000_000, 2).await, allow(4, 0, 2_000_000, 0));
    admitted[1] += 2;

    // 11.8 s, cost 2.
    // Smooth: 1 s = 2 tokens missing, 2 present → admitted, full at 13.8 s.
    assert_eq!(smooth.check(11_800_000, 2).await, allow(4, 0, 2_000_000, 0));
    admitted[0] += 2;
    // Interval: still 0 until 12 s (retry 200 ms); full at 13 s (1.2 s).
    assert_eq!(interval.check(11_800_000, 2).await, deny(4, 0, 200_000, 1_200_000));

    // Same trace, different answers: 4 + 1 + 2 = 7 against 4 + 2 = 6.
    assert_eq!(admitted, [7, 6]);

    // Long idle: both are full again, never above capacity.
    assert_eq!(smooth.peek(100_000_000).await, allow(4, 4, 0, 0));
    assert_eq!(interval.peek(100_000_000).await, allow(4, 4, 0, 0));
}

#[tokio::test]
async fn token_bucket_starting_below_capacity() {
    // Capacity 10, 1 token per second (1 token = 1_000_000 ticks, 1 tick per
    // µs), starting with 2 tokens.
    let trace = Trace::new(token_bucket(10, 1, Duration::from_secs(1), Refill::Smooth, Some(2)));
    // First touch at 0, cost 3: 2 tokens, denied; the third arrives after
    // 1 s; full after 8 missing tokens = 8 s. The level is anchored now.
    assert_eq!(trace.check(0, 3).await, deny(10, 2, SECOND, 8 * SECOND));
    // After retry_after: 2 + 1 = 3 tokens → admitted; empty, full in 10 s.
    assert_eq!(trace.check(SECOND, 3).await, allow(10, 0, 10 * SECOND, 0));
    // 1.5 s: half a token → denied for 500 ms; full again at 11 s, so
    // reset_after = 11 s − 1.5 s.
    assert_eq!(trace.check(1_500_000, 1).await, deny(10, 0, 500_000, 9_500_000));
    // 2 s: one token → admitted, full at 12 s.
    assert_eq!(trace.check(2 * SECOND, 1).await, allow(10, 0, 10 * SECOND, 0));
    // One µs before full: 10 − 1 tick → 9 whole tokens.
    assert_eq!(trace.peek(12 * SECOND - 1).await, allow(10, 9, 1, 0));
    // Full again: the state carries no information and is dropped, so the
    // idle key starts again at `initial` = 2 (as documented), 8 s from full.
    assert_eq!(trace.peek(12 * SECOND).await, allow(10, 2, 8 * SECOND, 0));
    // Cost above capacity: never.
    assert_eq!(trace.check(12 * SECOND, 11).await, never(10, 2, 8 * SECOND));

    // Interval mode from 0 tokens: 5 tokens at each multiple of 1 s.
    let empty = Trace::new(token_bucket(10, 5, Duration::from_secs(1), Refill::Interval, Some(0)));
    // 0.5 s: 0 tokens; one arrives at the boundary of 1 s (retry 500 ms); 10
    // missing need ⌈10 / 5⌉ = 2 boundaries → full at 2 s (reset 1.5 s).
    assert_eq!(empty.check(500_000, 1).await, deny(10, 0, 500_000, 1_500_000));
    // 1 s: 5 tokens; cost 5 → 0 left; full at 1 s + 2 s.
    assert_eq!(empty.check(SECOND, 5).await, allow(10, 0, 2 * SECOND, 0));
}

// ---------------------------------------------------------------------------
// reservation

#[tokio::test]
async fn reservation_borrows_and_the_next_caller_pays() {
    // 2 per second, at most 2 stored permits: 1 permit = 500_000 ticks, 1
    // tick per µs; a full store is 1_000_000 ticks. limit = max_burst + 1.
    let limit = Limit::reservation(2, Duration::from_secs(1), 2).unwrap();
    assert_eq!(limit.capacity(), 3);
    let trace = Trace::new(limit);
    // Fresh: 2 stored. One taken: 1 stored + the one more that always fits
    // = remaining 2; full again in 500 ms.
    assert_eq!(trace.reserve(0, 1, None).await, allow(3, 2, 500_000, 0));
    // Cost 3 with 1 stored: nothing is owed, so it is granted at once
    // (wait 0), borrowing 2 permits. Missing: 500k + 1.5M = 2M ticks → full
    // in 2 s; nothing left.
    assert_eq!(trace.reserve(0, 3, None).await, allow(3, 0, 2 * SECOND, 0));
    // The next caller pays: debt = 2M − 1M ticks = 1 s of wait. It books its
    // permit too: missing 2.5M → reset 2.5 s.
    assert_eq!(trace.reserve(0, 1, None).await, allow(3, 0, 2_500_000, SECOND));
    // 100 ms later, `check` = reserve with max_wait 0: debt 2.4M − 1M =
    // 1.4M ticks → denied, retry 1.4 s.
    assert_eq!(trace.check(100_000, 1).await, deny(3, 0, 1_400_000, 2_400_000));
    // max_wait 1 s: 1.4 s − 1 s = 400 ms too late → denied, nothing booked.
    assert_eq!(
        trace.reserve(100_000, 1, Some(SECOND)).await,
        deny(3, 0, 400_000, 2_400_000)
    );
    // max_wait 1.4 s: granted with wait 1.4 s (not more: the two denials
    // booked nothing); missing 2.9M → reset 2.9 s. This permit's moment is
    // 1.5 s, 500 ms (one permit at 2/s) after the previous caller's 1 s.
    assert_eq!(
        trace.reserve(100_000, 1, Some(1_400_000)).await,
        allow(3, 0, 2_900_000, 1_400_000)
    );

    // After idle (full at 0.1 s + 2.9 s = 3 s): max_burst = 2 stored permits
    // plus one more, then denials.
    assert_eq!(trace.check(3 * SECOND, 1).await, allow(3, 2, 500_000, 0));
    assert_eq!(trace.check(3 * SECOND, 1).await, allow(3, 1, SECOND, 0));
    // Store empty but no debt: this one borrows, granted at once.
    assert_eq!(trace.check(3 * SECOND, 1).await, allow(3, 0, 1_500_000, 0));
    // Debt 1.5M − 1M = 500k ticks → retry 500 ms.
    assert_eq!(trace.check(3 * SECOND, 1).await, deny(3, 0, 500_000, 1_500_000));
    // A cost-0 reserve (a peek) reports the wait a request would have now.
    assert_eq!(
        trace.reserve(3 * SECOND, 0, None).await,
        allow(3, 0, 1_500_000, 500_000)
    );
    // Waiting retry_after works: missing 1M ticks, debt 0.
    assert_eq!(trace.check(3_500_000, 1).await, allow(3, 0, 1_500_000, 0));

    // Any cost is granted when nothing is owed (only a cost too large to
    // compute is never admitted): cost 10 > limit 3 borrows 10 · 500k = 5M
    // ticks; the next caller waits 5M − 1M = 4 s.
    let big = Trace::new(Limit::reservation(2, Duration::from_secs(1), 2).unwrap());
    assert_eq!(big.check(0, 10).await, allow(3, 0, 5 * SECOND, 0));
    assert_eq!(big.check(0, 1).await, deny(3, 0, 4 * SECOND, 5 * SECOND));
}

#[tokio::test]
async fn reservation_starting_empty() {
    let limit = LimitSpec::Reservation(ReservationSpec {
        rate: 2,
        period: Duration::from_secs(1),
        max_burst: 2,
        initial: Some(0),
    })
    .build()
    .unwrap();
    let trace = Trace::new(limit);
    // 0 stored (missing 1M ticks = the full store), no debt: remaining 0 + 1.
    assert_eq!(trace.reserve(0, 0, None).await, allow(3, 1, SECOND, 0));
    // Granted at once, borrowing: missing 1.5M → full in 1.5 s.
    assert_eq!(trace.check(0, 1).await, allow(3, 0, 1_500_000, 0));
    // Debt 500k ticks: the next caller waits 500 ms.
    assert_eq!(trace.check(0, 1).await, deny(3, 0, 500_000, 1_500_000));
    assert_eq!(trace.reserve(0, 1, None).await, allow(3, 0, 2 * SECOND, 500_000));
}

// ---------------------------------------------------------------------------
// leaky_bucket

#[tokio::test]
async fn leaky_bucket_departures() {
    // 2 per second: each unit occupies the outlet for 500 ms (500_000 ticks,
    // 1 tick per µs). Capacity 3 units in the bucket, queued or leaving.
    let trace = Trace::new(Limit::leaky_bucket(2, Duration::from_secs(1), 3).unwrap());
    // Empty: departs now (wait 0); 1 unit in the bucket, drained at 500 ms.
    assert_eq!(trace.check(0, 1).await, allow(3, 2, 500_000, 0));
    // Departs when the first has left: 500 ms.
    assert_eq!(trace.check(0, 1).await, allow(3, 1, SECOND, 500_000));
    // Departs at 1 s; the bucket holds 3 units (one leaving, two queued).
    assert_eq!(trace.check(0, 1).await, allow(3, 0, 1_500_000, SECOND));
    // A fourth would overfill it by one unit = 500 ms of draining.
    assert_eq!(trace.check(0, 1).await, deny(3, 0, 500_000, 1_500_000));
    // Cost 4 > capacity 3: never.
    assert_eq!(trace.check(0, 4).await, never(3, 0, 1_500_000));
    // At 500 ms one unit has drained (queue until 1.5 s = 1M ticks): departs
    // at 1.5 s → wait 1 s; the bucket is full again.
    assert_eq!(trace.check(500_000, 1).await, allow(3, 0, 1_500_000, SECOND));
    // At 1 s: drained at 2 s → 1M ticks queued, 1 unit of room. With max_wait
    // 500 ms the departure (1 s away) is 500 ms too late.
    assert_eq!(
        trace.reserve(SECOND, 1, Some(500_000)).await,
        deny(3, 1, 500_000, SECOND)
    );
    // With max_wait 1 s: departs at 2 s.
    assert_eq!(
        trace.reserve(SECOND, 1, Some(SECOND)).await,
        allow(3, 0, 1_500_000, SECOND)
    );
    // Departures so far: 0, 0.5, 1, 1.5, 2 s — one every 500 ms.
    // A peek changes nothing and tells the wait a request would have now.
    assert_eq!(trace.peek(SECOND).await, allow(3, 0, 1_500_000, 1_500_000));
    assert_eq!(trace.check(SECOND, 1).await, deny(3, 0, 500_000, 1_500_000));
}

#[tokio::test]
async fn leaky_bucket_of_capacity_one_never_queues() {
    let trace = Trace::new(Limit::leaky_bucket(2, Duration::from_secs(1), 1).unwrap());
    // Leaves at once, occupies the outlet for 500 ms.
    assert_eq!(trace.check(0, 1).await, allow(1, 0, 500_000, 0));
    // 100 ms later 400 ms of it remain: no room, nothing queues.
    assert_eq!(trace.check(100_000, 1).await, deny(1, 0, 400_000, 400_000));
    // Even a reserve with any wait is refused rather than queued.
    assert_eq!(trace.reserve(100_000, 1, None).await, deny(1, 0, 400_000, 400_000));
    // At 500 ms the outlet is free: wait 0 again.
    assert_eq!(trace.check(500_000, 1).await, allow(1, 0, 500_000, 0));
}

#[tokio::test]
async fn leaky_bucket_seven_per_second_departs_exactly() {
    // 7 per second: 1 unit = 1_000_000 ticks, 7 ticks per µs, so departure k
    // is at ⌈k · 10⁶ / 7⌉ µs, and the eighth leaves at exactly 1 s.
    let trace = Trace::new(Limit::leaky_bucket(7, Duration::from_secs(1), 8).unwrap());
    let departures = [0, 142_858, 285_715, 428_572, 571_429, 714_286, 857_143, 1_000_000];
    for (k, &wait) in (0u64..).zip(&departures) {
        // Queued before it: k units; after it k + 1 → reset ⌈(k + 1) · 10⁶ / 7⌉.
        let reset_after = ((k + 1) * SECOND).div_ceil(7);
        assert_eq!(trace.check(0, 1).await, allow(8, 7 - k, reset_after, wait), "unit {k}");
    }
    // Full: overfull by one unit → retry ⌈10⁶ / 7⌉ = 142_858; drained at
    // ⌈8 · 10⁶ / 7⌉ = 1_142_858.
    assert_eq!(trace.check(0, 1).await, deny(8, 0, 142_858, 1_142_858));
}

// ---------------------------------------------------------------------------
// gcra

#[tokio::test]
async fn gcra_admits_the_burst_then_one_per_emission_interval() {
    // 10 per second, burst 5: T = 100 ms, τ + T = 5 T = 500 ms.
    let trace = Trace::new(Limit::gcra(10, Duration::from_secs(1), 5).unwrap());
    for k in 1..=5 {
        // After k cells the TAT is k · T ahead.
        assert_eq!(trace.check(0, 1).await, allow(5, 5 - k, k * 100_000, 0), "cell {k}");
    }
    // A sixth would put the TAT 600 ms ahead, 100 ms past τ + T.
    assert_eq!(trace.check(0, 1).await, deny(5, 0, 100_000, 500_000));
    // One per T from then on.
    assert_eq!(trace.check(100_000, 1).await, allow(5, 0, 500_000, 0));
    // Half an interval later: 50 ms to go (TAT 600 ms, 450 ms ahead).
    assert_eq!(trace.check(150_000, 1).await, deny(5, 0, 50_000, 450_000));
    assert_eq!(trace.check(200_000, 1).await, allow(5, 0, 500_000, 0));
    // Cost 6 > burst 5: never.
    assert_eq!(trace.check(200_000, 6).await, never(5, 0, 500_000));
    // TAT 700 ms; at 1 s it is past: cost 3 → 300 ms ahead, 2 cells left.
    assert_eq!(trace.check(SECOND, 3).await, allow(5, 2, 300_000, 0));
    // Cost 3 again: 600 ms ahead, 100 ms too far.
    assert_eq!(trace.check(SECOND, 3).await, deny(5, 2, 100_000, 300_000));
}

// ---------------------------------------------------------------------------
// concurrency

#[tokio::test]
async fn concurrency_leases() {
    // At most 2 in flight; a lease ends by itself 10 s after it was taken.
    let trace = Trace::new(Limit::concurrency(2, Duration::from_secs(10)).unwrap());
    // a: expires at 10 s.
    let taken = trace.acquire(0, "a", 1).await;
    assert_eq!(D::of(&taken.decision), allow(2, 1, 10 * SECOND, 0));
    assert_eq!(taken.lease.as_deref(), Some("a"));
    // b at 1 s: expires at 11 s; reset when the last ends, 11 s − 1 s.
    assert_eq!(
        D::of(&trace.acquire(SECOND, "b", 1).await.decision),
        allow(2, 0, 10 * SECOND, 0)
    );
    // c at 2 s: full. One unit frees when a ends at 10 s → retry 8 s;
    // reset 11 s − 2 s = 9 s. No lease is handed out.
    let refused = trace.acquire(2 * SECOND, "c", 1).await;
    assert_eq!(D::of(&refused.decision), deny(2, 0, 8 * SECOND, 9 * SECOND));
    assert_eq!(refused.lease, None);
    // Cost 2 needs both: a (1 unit) is not enough, a + b is at 11 s → 9 s.
    assert_eq!(
        D::of(&trace.acquire(2 * SECOND, "c", 2).await.decision),
        deny(2, 0, 9 * SECOND, 9 * SECOND)
    );
    // Release b at 3 s: a remains, ending at 10 s.
    assert_eq!(trace.release(3 * SECOND, "b").await, allow(2, 1, 7 * SECOND, 0));
    // c at 3 s: expires at 13 s.
    assert_eq!(
        D::of(&trace.acquire(3 * SECOND, "c", 1).await.decision),
        allow(2, 0, 10 * SECOND, 0)
    );
    // Renewing a at 5 s (same id): not counted twice; now expires at 15 s.
    assert_eq!(
        D::of(&trace.acquire(5 * SECOND, "a", 1).await.decision),
        allow(2, 0, 10 * SECOND, 0)
    );
    // One µs before c expires both are held; reset = 15 s − 12.999999 s.
    assert_eq!(trace.peek(13 * SECOND - 1).await, allow(2, 0, 2_000_001, 0));
    // At 13 s c has expired without a release: its slot is free.
    assert_eq!(trace.peek(13 * SECOND).await, allow(2, 1, 2 * SECOND, 0));
    // d for 2 units: one more must free, a's renewed expiry at 15 s → 2 s.
    assert_eq!(
        D::of(&trace.acquire(13 * SECOND, "d", 2).await.decision),
        deny(2, 1, 2 * SECOND, 2 * SECOND)
    );
    // At 15 s everything has expired: d takes both.
    assert_eq!(
        D::of(&trace.acquire(15 * SECOND, "d", 2).await.decision),
        allow(2, 0, 10 * SECOND, 0)
    );
    // Cost 3 > 2: never.
    assert_eq!(
        D::of(&trace.acquire(15 * SECOND, "e", 3).await.decision),
        never(2, 0, 10 * SECOND)
    );
    // Releasing an unknown lease is fine and changes nothing.
    assert_eq!(trace.release(15 * SECOND, "zzz").await, allow(2, 0, 10 * SECOND, 0));
    // A concurrency limit is taken with acquire, not check.
    let error = trace
        .limiter
        .decide(&trace.subject, &Request::new(Op::Check, 1).at(at(15 * SECOND)))
        .await
        .unwrap_err();
    assert!(error.is_invalid(), "{error}");
    assert!(error.to_string().contains("acquire"), "{error}");
}

#[tokio::test]
async fn concurrency_renewal_reports_the_lease_it_renews() {
    let trace = Trace::new(Limit::concurrency(2, Duration::from_secs(10)).unwrap());
    // c at 0 (expires 10 s), a at 1 s (expires 11 s).
    assert_eq!(
        D::of(&trace.acquire(0, "c", 1).await.decision),
        allow(2, 1, 10 * SECOND, 0)
    );
    assert_eq!(
        D::of(&trace.acquire(SECOND, "a", 1).await.decision),
        allow(2, 0, 10 * SECOND, 0)
    );
    // Renewing a for 2 units at 2 s: c still holds 1 → denied until c ends at
    // 10 s (retry 8 s). The denial changes nothing, so a and c still hold
    // both units (remaining 0) and the limit is untouched again when a ends
    // at 11 s (reset 9 s).
    assert_eq!(
        D::of(&trace.acquire(2 * SECOND, "a", 2).await.decision),
        deny(2, 0, 8 * SECOND, 9 * SECOND)
    );
    // What a peek says at the same instant.
    assert_eq!(trace.peek(2 * SECOND).await, allow(2, 0, 9 * SECOND, 0));
}

// ---------------------------------------------------------------------------
// Rates that do not divide evenly

/// A burst of 7 at 0, then `steps` more, each taken at the instant the
/// previous denial's `retry_after` named. 7 per second, 1 unit = 10⁶ ticks,
/// 7 ticks per µs: cell k (after the burst) is due at k · 10⁶ / 7 µs, so
/// it is admitted at ⌈k · 10⁶ / 7⌉, never later — no drift.
async fn seven_per_second(limit: Limit, steps: u64) {
    let trace = Trace::new(limit);
    for k in 1..=7 {
        // k of 7 taken; full again after ⌈k · 10⁶ / 7⌉ µs (142_858 for k = 1,
        // 1_000_000 for k = 7).
        assert_eq!(
            trace.check(0, 1).await,
            allow(7, 7 - k, (k * SECOND).div_ceil(7), 0),
            "burst {k}"
        );
    }
    // After the burst: 10⁶ / 7 = 142_857.14… rounds UP to 142_858.
    assert_eq!(trace.check(0, 1).await, deny(7, 0, 142_858, SECOND));
    let mut t = 0;
    for k in 1..=steps {
        let denied = trace.check(t, 1).await;
        let retry_after = denied.retry_after.expect("denied for now");
        // retry_after = ⌈k · 10⁶ / 7⌉ − ⌈(k − 1) · 10⁶ / 7⌉ ∈ {142_857, 142_858};
        // the limit is back to full exactly one second after each cell's
        // due time, which rounds to 1_000_000 µs.
        assert_eq!(denied, deny(7, 0, retry_after, SECOND), "step {k}");
        t += retry_after;
        assert_eq!(t, (k * SECOND).div_ceil(7), "step {k} lands on its due time");
        assert_eq!(trace.check(t, 1).await, allow(7, 0, SECOND, 0), "step {k}");
    }
    // Every 7 steps is exactly one second later.
    assert_eq!(t, steps / 7 * SECOND);
}

#[tokio::test]
async fn seven_per_second_lands_on_whole_seconds() {
    // 70 steps after the burst: exactly 10 s, on each algorithm with an
    // exact rate.
    seven_per_second(Limit::gcra(7, Duration::from_secs(1), 7).unwrap(), 70).await;
    seven_per_second(Limit::token_bucket(7, 7, Duration::from_secs(1)).unwrap(), 70).await;
    // max_burst 6: 6 stored + 1 borrowed = the same burst of 7.
    seven_per_second(Limit::reservation(7, Duration::from_secs(1), 6).unwrap(), 70).await;
    // 7000 steps: exactly 1000 s.
    seven_per_second(Limit::gcra(7, Duration::from_secs(1), 7).unwrap(), 7_000).await;
}

#[tokio::test]
async fn seven_per_second_at_exact_rational_times() {
    // After a burst of 7 at 0, request k arrives at ⌈k · 10⁶ / 7⌉ µs (its
    // due time, rounded up to the µs), k = 1..=7000: every one is admitted
    // and a second one at the same instant is not.
    let trace = Trace::new(Limit::gcra(7, Duration::from_secs(1), 7).unwrap());
    for _ in 0..7 {
        assert!(trace.check(0, 1).await.allowed);
    }
    let mut per_second = vec![0u32; 1_000];
    for k in 1..=7_000u64 {
        let t = (k * SECOND).div_ceil(7);
        // The TAT is 10⁶ + k · 10⁶ / 7 exactly, so the cell finishes 1 s
        // after its due time: reset_after rounds to 10⁶.
        assert_eq!(trace.check(t, 1).await, allow(7, 0, SECOND, 0), "request {k}");
        // The next is due at ⌈(k + 1) · 10⁶ / 7⌉.
        let next = ((k + 1) * SECOND).div_ceil(7);
        assert_eq!(
            trace.check(t, 1).await,
            deny(7, 0, next - t, SECOND),
            "request {k} twice"
        );
        if let Some(count) = per_second.get_mut(usize::try_from(t / SECOND).unwrap()) {
            *count += 1;
        }
    }
    // Second s holds k = 7s ..= 7s + 6 (k = 7s lands exactly on s · 10⁶):
    // exactly 7 in each full second, from the first to the last.
    assert!(per_second[1..].iter().all(|&count| count == 7), "{per_second:?}");
    // Second 0 holds k = 1..=6 after the burst.
    assert_eq!(per_second[0], 6);
}

#[tokio::test]
async fn seven_per_second_reservation_wait_rounds_up() {
    // max_burst 0: one permit at a time; 1 permit = 10⁶ ticks, 7 per µs.
    let trace = Trace::new(Limit::reservation(7, Duration::from_secs(1), 0).unwrap());
    // Granted; the store is full again after ⌈10⁶ / 7⌉ = 142_858 µs.
    assert_eq!(trace.check(0, 1).await, allow(1, 0, 142_858, 0));
    assert_eq!(trace.check(0, 1).await, deny(1, 0, 142_858, 142_858));
    // Reserved: wait 142_858, the next after ⌈2 · 10⁶ / 7⌉ = 285_715.
    assert_eq!(trace.reserve(0, 1, None).await, allow(1, 0, 285_715, 142_858));
    assert_eq!(trace.reserve(0, 1, None).await, allow(1, 0, 428_572, 285_715));
}

#[tokio::test]
async fn one_per_three_hours() {
    let gcra = Limit::from_json(r#"{"algorithm":"gcra","rate":1,"period":"3h","burst":1}"#).unwrap();
    assert_eq!(gcra, Limit::gcra(1, Duration::from_secs(3 * 3_600), 1).unwrap());
    let trace = Trace::new(gcra);
    // T = 3 h = 10_800_000_000 µs.
    assert_eq!(trace.check(HOUR, 1).await, allow(1, 0, 3 * HOUR, 0));
    // The TAT is at 4 h: 1 h to go.
    assert_eq!(trace.check(3 * HOUR, 1).await, deny(1, 0, HOUR, HOUR));
    assert_eq!(trace.check(4 * HOUR, 1).await, allow(1, 0, 3 * HOUR, 0));

    // The same rate refilled in whole tokens at multiples of 3 h since the
    // epoch: the token taken at 1 h comes back at 3 h, not 4 h.
    let interval = Trace::new(
        Limit::from_json(r#"{"algorithm":"token_bucket","capacity":1,"refill":1,"interval":"3h","mode":"interval"}"#)
            .unwrap(),
    );
    assert_eq!(interval.check(HOUR, 1).await, allow(1, 0, 2 * HOUR, 0));
    assert_eq!(interval.check(2 * HOUR, 1).await, deny(1, 0, HOUR, HOUR));
    // Boundary 1 (3 h): a token; the next at 6 h.
    assert_eq!(interval.check(3 * HOUR, 1).await, allow(1, 0, 3 * HOUR, 0));
}

#[tokio::test]
async fn one_hundred_thousand_per_second() {
    // 100 000 per second: gcd(10⁵, 10⁶) = 10⁵ → 1 token = 10 ticks, 1 tick
    // per µs: one token every 10 µs.
    let trace = Trace::new(Limit::token_bucket(100_000, 100_000, Duration::from_secs(1)).unwrap());
    // Empty the bucket: 10⁶ ticks missing → full in 1 s.
    assert_eq!(trace.check(0, 100_000).await, allow(100_000, 0, SECOND, 0));
    // 5 µs: half a token; 5 µs to go; full at 10⁶ (999_995 µs away).
    assert_eq!(trace.check(5, 1).await, deny(100_000, 0, 5, 999_995));
    // 10 µs: one token.
    assert_eq!(trace.check(10, 1).await, allow(100_000, 0, SECOND, 0));
    // 500 ms: full at 1_000_010 → 500_010 ticks missing, 499_990 present =
    // 49 999 whole tokens. 50 000 need 10 ticks = 10 µs more.
    assert_eq!(trace.check(500_000, 50_000).await, deny(100_000, 49_999, 10, 500_010));
    // 49 999 fit exactly: missing 500_010 + 499_990 = 10⁶.
    assert_eq!(trace.check(500_000, 49_999).await, allow(100_000, 0, SECOND, 0));

    // GCRA with burst 1: one every 10 µs; over one second exactly 100 000.
    let gcra = Trace::new(Limit::gcra(100_000, Duration::from_secs(1), 1).unwrap());
    assert_eq!(gcra.check(0, 1).await, allow(1, 0, 10, 0));
    assert_eq!(gcra.check(9, 1).await, deny(1, 0, 1, 1));
    let mut admitted = 1;
    let mut t = 10;
    while t < SECOND {
        assert_eq!(gcra.check(t, 1).await, allow(1, 0, 10, 0), "at {t}");
        admitted += 1;
        t += 10;
    }
    assert_eq!(admitted, 100_000);
}

// ---------------------------------------------------------------------------
// Costs

#[tokio::test]
async fn a_cost_above_the_limit_is_never_admitted_and_consumes_nothing() {
    // Each limit admits 5 at once; one unit is taken at 0, then a cost that
    // can never fit is refused (retry_after None) and a peek shows the state
    // of after the first unit, unchanged.
    let second = Duration::from_secs(1);
    let cases = [
        // count 1 in [0, 1 s).
        (Limit::fixed_window(5, second).unwrap(), 6, allow(5, 4, SECOND, 0)),
        // 100 ms sub-intervals: sub-interval 0 counts until 11 · 100 ms.
        (
            Limit::sliding_window(5, second, 10).unwrap(),
            6,
            allow(5, 4, 1_100_000, 0),
        ),
        (Limit::sliding_log(5, second).unwrap(), 6, allow(5, 4, SECOND, 0)),
        // 1 token per 200 ms.
        (Limit::token_bucket(5, 5, second).unwrap(), 6, allow(5, 4, 200_000, 0)),
        // T = 200 ms.
        (Limit::gcra(5, second, 5).unwrap(), 6, allow(5, 4, 200_000, 0)),
        // The unit in the bucket leaves in 200 ms: a peek's wait says so.
        (
            Limit::leaky_bucket(5, second, 5).unwrap(),
            6,
            allow(5, 4, 200_000, 200_000),
        ),
        // limit = max_burst 4 + 1; 4 − 1 stored + 1 = remaining 4. Any
        // computable cost is granted, so "never" takes a cost past 2^52 ticks.
        (
            Limit::reservation(5, second, 4).unwrap(),
            u64::MAX,
            allow(5, 4, 200_000, 0),
        ),
    ];
    for (limit, too_much, after_one) in cases {
        let name = limit.to_string();
        let trace = Trace::new(limit);
        assert!(trace.check(0, 1).await.allowed, "{name}");
        assert_eq!(trace.peek(0).await, after_one, "{name}");
        let refused = trace.outcome(0, Op::Check, too_much).await;
        assert!(refused.decision.is_never(), "{name}");
        assert_eq!(refused.granted, 0, "{name}");
        assert_eq!(D::of(&refused.decision), never(5, 4, after_one.reset_after), "{name}");
        assert_eq!(trace.peek(0).await, after_one, "{name}: the refusal consumed");
    }

    // Concurrency: a lease of 6 on a limit of 5.
    let trace = Trace::new(Limit::concurrency(5, Duration::from_secs(1)).unwrap());
    assert!(trace.acquire(0, "x", 1).await.decision.allowed);
    assert_eq!(trace.peek(0).await, allow(5, 4, SECOND, 0));
    let refused = trace.acquire(0, "y", 6).await;
    assert_eq!(D::of(&refused.decision), never(5, 4, SECOND));
    assert_eq!(refused.lease, None);
    assert_eq!(trace.peek(0).await, allow(5, 4, SECOND, 0));
}

#[tokio::test]
async fn check_at_most_grants_what_is_available() {
    // GCRA 10 per second, burst 5: T = 100 ms.
    let trace = Trace::new(Limit::gcra(10, Duration::from_secs(1), 5).unwrap());
    // 5 available, 3 asked: all 3 granted, TAT 300 ms ahead.
    let first = trace.outcome(0, Op::CheckAtMost, 3).await;
    assert_eq!((first.granted, D::of(&first.decision)), (3, allow(5, 2, 300_000, 0)));
    // 2 available, 4 asked: 2 granted, TAT 500 ms ahead.
    let second = trace.outcome(0, Op::CheckAtMost, 4).await;
    assert_eq!((second.granted, D::of(&second.decision)), (2, allow(5, 0, 500_000, 0)));
    // Nothing available: denied for the time one unit takes, 100 ms.
    let third = trace.outcome(0, Op::CheckAtMost, 4).await;
    assert_eq!(
        (third.granted, D::of(&third.decision)),
        (0, deny(5, 0, 100_000, 500_000))
    );
    // At 250 ms the TAT is 250 ms ahead: ⌊250 / 100⌋ = 2 available → 2
    // granted, 450 ms ahead, 0 whole cells left.
    let fourth = trace.outcome(250_000, Op::CheckAtMost, 4).await;
    assert_eq!((fourth.granted, D::of(&fourth.decision)), (2, allow(5, 0, 450_000, 0)));
}

// ---------------------------------------------------------------------------
// Policies

#[tokio::test]
async fn a_policy_is_all_or_nothing() {
    // per_second: GCRA 3 per second, burst 3 (1 cell = 10⁶ ticks, 3 ticks per
    // µs, τ + T = 3·10⁶ ticks). per_minute: fixed window of 6 per minute.
    let per_second = Limit::gcra(3, Duration::from_secs(1), 3).unwrap();
    let per_minute = Limit::fixed_window(6, Duration::from_secs(60)).unwrap();
    let trace = Trace::new(Policy::new([("per_second", per_second), ("per_minute", per_minute)]).unwrap());

    // Cost 2 at 0: GCRA 2·10⁶ ticks ahead → 1 left, ⌈2·10⁶ / 3⌉ = 666_667 µs;
    // window count 2 → 4 left, 60 s. The policy answers with the least
    // remaining: per_second.
    let first = trace.outcome(0, Op::Check, 2).await;
    assert_eq!(D::of(&first.decision), allow(3, 1, 666_667, 0));
    assert_eq!(first.granted, 2);
    assert_eq!(
        named(&first),
        [
            ("per_second", allow(3, 1, 666_667, 0)),
            ("per_minute", allow(6, 4, 60 * SECOND, 0)),
        ]
    );

    // Cost 2 again at 0: GCRA would be 4·10⁶ ahead, 10⁶ ticks past τ + T →
    // denied, retry ⌈10⁶ / 3⌉ = 333_334. The window would admit; it reports
    // as a peek (count still 2), and the policy's decision is the denial.
    let denied = trace.outcome(0, Op::Check, 2).await;
    assert_eq!(D::of(&denied.decision), deny(3, 1, 333_334, 666_667));
    assert_eq!(denied.granted, 0);
    assert_eq!(
        named(&denied),
        [
            ("per_second", deny(3, 1, 333_334, 666_667)),
            ("per_minute", allow(6, 4, 60 * SECOND, 0)),
        ]
    );
    // Neither consumed: peeking both shows the state after the first request.
    let peeked = trace.outcome(0, Op::Check, 0).await;
    assert_eq!(
        named(&peeked),
        [
            ("per_second", allow(3, 1, 666_667, 0)),
            ("per_minute", allow(6, 4, 60 * SECOND, 0)),
        ]
    );

    // 1 s, cost 3: the TAT (666_666.67 µs) has passed → GCRA 3·10⁶ ahead, 0
    // left, 1 s; window count 5 → 1 left, 59 s.
    let third = trace.outcome(SECOND, Op::Check, 3).await;
    assert_eq!(D::of(&third.decision), allow(3, 0, SECOND, 0));
    assert_eq!(
        named(&third),
        [
            ("per_second", allow(3, 0, SECOND, 0)),
            ("per_minute", allow(6, 1, 59 * SECOND, 0)),
        ]
    );

    // 2 s, cost 2: the TAT is exactly now, so GCRA admits; the window would
    // count 7 > 6 → denied until 60 s (58 s). This time the minute denies.
    let fourth = trace.outcome(2 * SECOND, Op::Check, 2).await;
    assert_eq!(D::of(&fourth.decision), deny(6, 1, 58 * SECOND, 58 * SECOND));
    assert_eq!(fourth.granted, 0);
    assert_eq!(
        named(&fourth),
        [
            ("per_second", allow(3, 3, 0, 0)),
            ("per_minute", deny(6, 1, 58 * SECOND, 58 * SECOND)),
        ]
    );
    // Neither consumed: GCRA untouched (3 left), window still 1 left. The
    // policy's answer is the least remaining: per_minute.
    let peeked = trace.outcome(2 * SECOND, Op::Check, 0).await;
    assert_eq!(D::of(&peeked.decision), allow(6, 1, 58 * SECOND, 0));
    assert_eq!(
        named(&peeked),
        [
            ("per_second", allow(3, 3, 0, 0)),
            ("per_minute", allow(6, 1, 58 * SECOND, 0)),
        ]
    );

    // check_at_most 5 at 2 s: min(3, 1) = 1 available → 1 granted.
    let at_most = trace.outcome(2 * SECOND, Op::CheckAtMost, 5).await;
    assert_eq!(at_most.granted, 1);
    assert_eq!(D::of(&at_most.decision), allow(6, 0, 58 * SECOND, 0));
    assert_eq!(
        named(&at_most),
        [
            // One cell: 10⁶ ticks ahead → ⌈10⁶ / 3⌉ µs.
            ("per_second", allow(3, 2, 333_334, 0)),
            ("per_minute", allow(6, 0, 58 * SECOND, 0)),
        ]
    );
    // Nothing left this minute: a unit is asked for so the denial says when.
    let none = trace.outcome(2 * SECOND, Op::CheckAtMost, 5).await;
    assert_eq!(none.granted, 0);
    assert_eq!(D::of(&none.decision), deny(6, 0, 58 * SECOND, 58 * SECOND));
    // The next minute: min(3, 6, 5) = 3 granted.
    let next_minute = trace.outcome(60 * SECOND, Op::CheckAtMost, 5).await;
    assert_eq!(next_minute.granted, 3);
    assert_eq!(D::of(&next_minute.decision), allow(3, 0, SECOND, 0));
}

// ---------------------------------------------------------------------------
// Validation

fn invalid(result: Result<Limit, tollgate::Error>) -> String {
    let error = result.expect_err("the limit is invalid");
    assert_eq!(error.kind(), ErrorKind::InvalidLimit, "{error}");
    assert!(error.is_invalid());
    error.to_string()
}

#[test]
fn invalid_limits_are_refused_naming_the_field() {
    let second = Duration::from_secs(1);
    assert_eq!(invalid(Limit::gcra(10, second, 0)), "burst must be at least 1");
    assert_eq!(invalid(Limit::gcra(0, second, 5)), "rate must be at least 1");
    assert_eq!(invalid(Limit::fixed_window(0, second)), "limit must be at least 1");
    assert_eq!(invalid(Limit::gcra(10, Duration::ZERO, 5)), "period must be positive");
    assert_eq!(invalid(Limit::concurrency(1, Duration::ZERO)), "ttl must be positive");

    let message = invalid(Limit::from_json(
        r#"{"algorithm":"gcra","rate":10,"period":"1s","bursts":5}"#,
    ));
    assert!(message.contains("\"bursts\""), "{message}");
    let message = invalid(Limit::from_json(r#"{"algorithm":"gcra","rate":10,"period":"1s"}"#));
    assert!(message.contains("burst"), "{message}");

    let message = invalid(Limit::from_json(
        r#"{"algorithm":"gcra","rate":10,"period":"10","burst":5}"#,
    ));
    assert!(
        message.contains("period") && message.contains("needs a unit"),
        "{message}"
    );
    let message = invalid(Limit::from_json(
        r#"{"algorithm":"gcra","rate":10,"period":10,"burst":5}"#,
    ));
    assert!(
        message.contains("period") && message.contains("needs a unit"),
        "{message}"
    );
    assert_eq!(
        invalid(Limit::from_json(
            r#"{"algorithm":"gcra","rate":10,"period":"0s","burst":5}"#
        )),
        "period must be positive"
    );

    // 10⁶ cells of 1 per day: 10⁶ · 86_400 · 10⁶ ticks ≫ 2^52.
    let message = invalid(Limit::gcra(1, Duration::from_secs(86_400), 1_000_000));
    assert!(message.contains("too large") && message.contains("burst"), "{message}");

    let message = invalid(
        LimitSpec::TokenBucket(TokenBucketSpec {
            capacity: 5,
            refill: 1,
            interval: second,
            mode: Refill::Smooth,
            initial: Some(6),
            max_debt: None,
        })
        .build(),
    );
    assert_eq!(message, "initial (6) must be at most capacity (5)");

    // 1 s in 3 buckets is not a whole number of µs per bucket.
    let message = invalid(Limit::sliding_window(10, second, 3));
    assert!(message.contains("window") && message.contains("3 buckets"), "{message}");

    let message = invalid(Limit::from_json(
        r#"{"algorithm":"leaky","rate":1,"period":"1s","capacity":1}"#,
    ));
    assert!(message.starts_with("unknown algorithm \"leaky\""), "{message}");
}

#[test]
fn invalid_policies_are_refused_naming_the_limit() {
    let limit = || Limit::gcra(10, Duration::from_secs(1), 5).unwrap();
    let error = Policy::new([("per second", limit())]).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidLimit);
    assert!(error.to_string().contains("\"per second\""), "{error}");
    let error = Policy::new([("a", limit()), ("a", limit())]).unwrap_err();
    assert!(error.to_string().contains("used twice"), "{error}");
    let error = Policy::new(Vec::<(String, Limit)>::new()).unwrap_err();
    assert!(error.to_string().contains("at least one limit"), "{error}");
    let error = Policy::from_json(
        r#"{"per_second":{"algorithm":"gcra","rate":10,"period":"1s","burst":0},
            "per_hour":{"algorithm":"fixed_window","limit":1000,"window":"1h"}}"#,
    )
    .unwrap_err();
    assert_eq!(error.to_string(), "per_second: burst must be at least 1");
}

// ---------------------------------------------------------------------------
// Limiter::acquire on a manual clock

const T0: u64 = 1_700_000_000_000_000;

fn on_clock(limit: Limit) -> (Limiter, ManualClock, Subject) {
    let clock = ManualClock::new(at(T0));
    let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()), limit);
    (limiter, clock, Subject::new("worker"))
}

fn granted(acquired: Acquired) -> (D, tollgate::Permit) {
    match acquired {
        Acquired::Granted(permit) => (D::of(permit.decision()), permit),
        Acquired::Denied(decision) => panic!("denied: {decision:?}"),
    }
}

fn denied(acquired: &Acquired) -> D {
    assert!(!acquired.is_granted(), "granted: {:?}", acquired.decision());
    D::of(acquired.decision())
}

fn elapsed(clock: &ManualClock) -> u64 {
    clock.now().as_micros() - T0
}

#[tokio::test]
async fn acquire_on_a_reservation_waits_by_advancing_the_clock() {
    // 2 per second, 1 stored permit: 1 permit = 500_000 ticks, full store =
    // 500_000 ticks, limit 2.
    let (limiter, clock, subject) = on_clock(Limit::reservation(2, Duration::from_secs(1), 1).unwrap());
    let second = Duration::from_secs(1);
    // The stored permit: no wait.
    let (decision, permit) = granted(limiter.acquire(&subject, 1, second).await.unwrap());
    assert_eq!(decision, allow(2, 1, 500_000, 0));
    assert_eq!(permit.lease(), None);
    assert_eq!(permit.release().await.unwrap(), None);
    // Borrowed, still no debt before it: no wait.
    let (decision, _) = granted(limiter.acquire(&subject, 1, second).await.unwrap());
    assert_eq!(decision, allow(2, 0, SECOND, 0));
    assert_eq!(elapsed(&clock), 0);
    // Debt 10⁶ − 500k ticks: this one waits 500 ms, and the manual clock is
    // moved by that much instead of sleeping.
    let (decision, _) = granted(limiter.acquire(&subject, 1, second).await.unwrap());
    assert_eq!(decision, allow(2, 0, 1_500_000, 500_000));
    assert_eq!(elapsed(&clock), 500_000);
    // Now 1.5M − 500k = 10⁶ ticks missing, debt 500 ms: a 100 ms timeout is
    // 400 ms short, so it is refused at once, the clock untouched.
    let refused = denied(&limiter.acquire(&subject, 1, Duration::from_millis(100)).await.unwrap());
    assert_eq!(refused, deny(2, 0, 400_000, SECOND));
    assert_eq!(elapsed(&clock), 500_000);
    // With 2 s to spare it waits the 500 ms.
    let (decision, _) = granted(limiter.acquire(&subject, 1, 2 * second).await.unwrap());
    assert_eq!(decision, allow(2, 0, 1_500_000, 500_000));
    assert_eq!(elapsed(&clock), SECOND);
}

#[tokio::test]
async fn acquire_on_a_leaky_bucket_waits_for_its_departure() {
    // 2 per second (500 ms per unit), capacity 3.
    let (limiter, clock, subject) = on_clock(Limit::leaky_bucket(2, Duration::from_secs(1), 3).unwrap());
    let timeout = Duration::from_secs(5);
    let (decision, _) = granted(limiter.acquire(&subject, 1, timeout).await.unwrap());
    assert_eq!(decision, allow(3, 2, 500_000, 0));
    assert_eq!(elapsed(&clock), 0);
    // Departs when the first has left: the clock moves 500 ms.
    let (decision, _) = granted(limiter.acquire(&subject, 1, timeout).await.unwrap());
    assert_eq!(decision, allow(3, 1, SECOND, 500_000));
    assert_eq!(elapsed(&clock), 500_000);
    // At 500 ms the queue drains at 1 s: wait 500 ms more.
    let (decision, _) = granted(limiter.acquire(&subject, 1, timeout).await.unwrap());
    assert_eq!(decision, allow(3, 1, SECOND, 500_000));
    assert_eq!(elapsed(&clock), SECOND);
    // Cost 3 at 1 s: 1 unit still queued (until 1.5 s), 3 more overfill by
    // one → retried after 500 ms (clock at 1.5 s), then it departs at once.
    let (decision, _) = granted(limiter.acquire(&subject, 3, timeout).await.unwrap());
    assert_eq!(decision, allow(3, 0, 1_500_000, 0));
    assert_eq!(elapsed(&clock), 1_500_000);
}

#[tokio::test]
async fn acquire_on_gcra_retries_after_retry_after() {
    // 10 per second, burst 1: T = 100 ms.
    let (limiter, clock, subject) = on_clock(Limit::gcra(10, Duration::from_secs(1), 1).unwrap());
    let (decision, _) = granted(limiter.acquire(&subject, 1, Duration::from_secs(1)).await.unwrap());
    assert_eq!(decision, allow(1, 0, 100_000, 0));
    // Denied for 100 ms, which fits the 1 s timeout: the clock moves, then
    // the retry is admitted.
    let (decision, _) = granted(limiter.acquire(&subject, 1, Duration::from_secs(1)).await.unwrap());
    assert_eq!(decision, allow(1, 0, 100_000, 0));
    assert_eq!(elapsed(&clock), 100_000);
    // 100 ms does not fit 50 ms.
    let refused = denied(&limiter.acquire(&subject, 1, Duration::from_millis(50)).await.unwrap());
    assert_eq!(refused, deny(1, 0, 100_000, 100_000));
    assert_eq!(elapsed(&clock), 100_000);
}

#[tokio::test]
async fn acquire_on_a_concurrency_limit_holds_a_lease_until_released() {
    // One in flight; leases end by themselves after 30 s.
    let (limiter, clock, subject) = on_clock(Limit::concurrency(1, Duration::from_secs(30)).unwrap());
    let (decision, permit) = granted(limiter.acquire(&subject, 1, Duration::ZERO).await.unwrap());
    assert_eq!(decision, allow(1, 0, 30 * SECOND, 0));
    assert_eq!(permit.lease().map(str::len), Some(16));
    // Held: the only slot frees when the lease ends in 30 s, beyond 1 s.
    let refused = denied(&limiter.acquire(&subject, 1, Duration::from_secs(1)).await.unwrap());
    assert_eq!(refused, deny(1, 0, 30 * SECOND, 30 * SECOND));
    assert_eq!(elapsed(&clock), 0);
    // Released: the slot is free, nothing in flight.
    let released = permit.release().await.unwrap().expect("a lease");
    assert_eq!(D::of(&released), allow(1, 1, 0, 0));

    // Dropping a permit releases its lease (in the background).
    let (decision, permit) = granted(limiter.acquire(&subject, 1, Duration::ZERO).await.unwrap());
    assert_eq!(decision, allow(1, 0, 30 * SECOND, 0));
    assert_eq!(
        D::of(&limiter.peek(&subject).await.unwrap()),
        allow(1, 0, 30 * SECOND, 0)
    );
    drop(permit);
    let mut freed = false;
    for _ in 0..100 {
        tokio::task::yield_now().await;
        if limiter.peek(&subject).await.unwrap().remaining == 1 {
            freed = true;
            break;
        }
    }
    assert!(freed, "dropping the permit did not release its lease");
    assert_eq!(D::of(&limiter.peek(&subject).await.unwrap()), allow(1, 1, 0, 0));

    // A holder that never releases: a waiter with a long enough timeout
    // waits out the ttl (the clock moves 30 s) and gets the slot.
    let (_, held) = granted(limiter.acquire(&subject, 1, Duration::ZERO).await.unwrap());
    let (decision, waiter) = granted(limiter.acquire(&subject, 1, Duration::from_secs(60)).await.unwrap());
    assert_eq!(decision, allow(1, 0, 30 * SECOND, 0));
    assert_eq!(elapsed(&clock), 30 * SECOND);
    assert_ne!(held.lease(), waiter.lease());
    // The expired holder giving back its lease does not free the waiter's slot.
    let after = held.release().await.unwrap().expect("a lease");
    assert_eq!(D::of(&after), allow(1, 0, 30 * SECOND, 0));
    let after = waiter.release().await.unwrap().expect("a lease");
    assert_eq!(D::of(&after), allow(1, 1, 0, 0));
}

// ---------------------------------------------------------------------------
// A clock that goes backwards

#[tokio::test]
async fn fixed_window_keeps_its_bound_when_the_clock_goes_back() {
    // ManualClock::set: "it may go backwards; the algorithms then treat newer
    // state conservatively". The fixed window's bound: at most `limit` per
    // aligned window.
    let clock = ManualClock::new(at(1_500_000));
    let limiter = Limiter::new(
        MemoryStore::with_clock(clock.clone()),
        Limit::fixed_window(2, Duration::from_secs(1)).unwrap(),
    );
    let subject = Subject::new("skewed");
    // Window [1 s, 2 s): 2 admitted.
    assert_eq!(
        D::of(&limiter.check_n(&subject, 2).await.unwrap()),
        allow(2, 0, 500_000, 0)
    );
    // Window [2 s, 3 s): 2 admitted.
    clock.set(at(2_100_000));
    assert_eq!(
        D::of(&limiter.check_n(&subject, 2).await.unwrap()),
        allow(2, 0, 900_000, 0)
    );
    // Back to 1.9 s: window [1 s, 2 s) already holds 2 → must be denied.
    clock.set(at(1_900_000));
    assert!(!limiter.check(&subject).await.unwrap().allowed);
    // Forward to 2.2 s: window [2 s, 3 s) holds 2 → denied until 3 s.
    clock.set(at(2_200_000));
    assert_eq!(
        D::of(&limiter.check(&subject).await.unwrap()),
        deny(2, 0, 800_000, 800_000)
    );
}

#[tokio::test]
async fn interval_token_bucket_keeps_its_bound_when_the_clock_goes_back() {
    // Capacity 2, 2 tokens at each whole second. Bound: over [a, b] at most
    // 2 + 2 · (boundaries in (a, b]).
    let clock = ManualClock::new(at(1_500_000));
    let limiter = Limiter::new(
        MemoryStore::with_clock(clock.clone()),
        token_bucket(2, 2, Duration::from_secs(1), Refill::Interval, None),
    );
    let subject = Subject::new("skewed");
    let mut admitted = 0;
    // 1.5 s: both tokens; full again at the 2 s boundary.
    assert_eq!(
        D::of(&limiter.check_n(&subject, 2).await.unwrap()),
        allow(2, 0, 500_000, 0)
    );
    admitted += 2;
    // 2.1 s: boundary 2 refilled 2; take 1, full again at 3 s.
    clock.set(at(2_100_000));
    assert_eq!(
        D::of(&limiter.check_n(&subject, 1).await.unwrap()),
        allow(2, 1, 900_000, 0)
    );
    admitted += 1;
    // Back to 1.9 s: the newer level holds 1 token (taking it, or refusing
    // the late request, are both conservative).
    clock.set(at(1_900_000));
    let late = limiter.check(&subject).await.unwrap().allowed;
    if late {
        admitted += 1;
    }
    // Forward to 2.2 s: no boundary since 2.1 s, so 1 token is left, or 0 if
    // the late request took it; 2 tokens arrive at 3 s (800 ms), which is
    // also when the bucket is full again.
    clock.set(at(2_200_000));
    let decision = D::of(&limiter.check_n(&subject, 2).await.unwrap());
    if decision.allowed {
        admitted += 2;
    }
    // [1.5 s, 2.2 s] crosses one boundary: at most 2 + 2 = 4.
    assert!(admitted <= 4, "admitted {admitted} in [1.5 s, 2.2 s]");
    assert_eq!(decision, deny(2, u64::from(!late), 800_000, 800_000));
}

// ---------------------------------------------------------------------------
// Releasing a lease under a policy that also borrows

#[tokio::test]
async fn a_release_is_never_denied() {
    // in_flight: 2 leases of 30 s. rate: 1 per second, nothing stored (1
    // permit = 10⁶ ticks, 1 tick per µs, limit 0 + 1).
    let policy = Policy::new([
        ("in_flight", Limit::concurrency(2, Duration::from_secs(30)).unwrap()),
        ("rate", Limit::reservation(1, Duration::from_secs(1), 0).unwrap()),
    ])
    .unwrap();
    let trace = Trace::new(policy);
    // Lease x; the permit is granted at once and borrowed (debt 1 s). The
    // policy answers with the least remaining: rate.
    let taken = trace.acquire(0, "x", 1).await;
    assert_eq!(taken.lease.as_deref(), Some("x"));
    assert_eq!(
        named(&taken),
        [
            ("in_flight", allow(2, 1, 30 * SECOND, 0)),
            ("rate", allow(1, 0, SECOND, 0)),
        ]
    );
    // Giving x back: the lease ends (2 free again). The rate limit only
    // reports; a release consumes nothing and must not be refused, nor make
    // anyone wait.
    let released = trace.outcome(0, Op::Release { lease: "x".to_owned() }, 0).await;
    assert_eq!(named(&released)[0], ("in_flight", allow(2, 2, 0, 0)));
    // The lease did end (the store kept the release although the policy
    // reported a denial): both slots are free.
    let peeked = trace.outcome(0, Op::Check, 0).await;
    assert_eq!(named(&peeked)[0], ("in_flight", allow(2, 2, 0, 0)));
    assert!(released.decision.allowed, "{:?}", named(&released));
    assert_eq!(released.decision.wait, Duration::ZERO);
}
