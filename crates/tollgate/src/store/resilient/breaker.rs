//! The circuit breaker: closed, it counts consecutive faults; open, it
//! refuses calls for a back-off, then lets one call probe the store.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The circuit breaker. Closed, it counts consecutive faults; open, it
/// refuses calls until `open_until`, when the first caller to claim the
/// instant probes the store (and moves `open_until` one back-off on, so that
/// a probe that never returns cannot keep the store skipped for good).
pub(super) struct Breaker {
    epoch: Instant,
    threshold: u64,
    first_backoff: u64,
    max_backoff: u64,
    /// Consecutive faults while closed.
    failures: AtomicU64,
    /// µs since `epoch` until which calls are refused; 0: closed.
    open_until: AtomicU64,
    /// The current back-off, µs.
    backoff: AtomicU64,
    pub(super) opened: AtomicU64,
}

pub(super) fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

impl Breaker {
    pub(super) fn new(threshold: u64, backoff: Duration, max_backoff: Duration) -> Self {
        Self {
            epoch: Instant::now(),
            threshold,
            first_backoff: micros(backoff).max(1),
            max_backoff: micros(max_backoff).max(1),
            failures: AtomicU64::new(0),
            open_until: AtomicU64::new(0),
            backoff: AtomicU64::new(micros(backoff).max(1)),
            opened: AtomicU64::new(0),
        }
    }

    pub(super) fn now(&self) -> u64 {
        micros(self.epoch.elapsed()).max(1)
    }

    pub(super) fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }

    /// Whether a call may go to the store now (closed, or the probe).
    pub(super) fn admits(&self) -> bool {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return true;
        }
        let now = self.now();
        if now < until {
            return false;
        }
        let next = now + self.backoff.load(Ordering::Relaxed);
        self.open_until
            .compare_exchange(until, next, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// A call succeeded; true when that closed an open breaker.
    pub(super) fn succeeded(&self) -> bool {
        // Read before writing: a healthy store's decisions leave the shared
        // lines untouched.
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        if self.open_until.load(Ordering::Acquire) == 0 || self.open_until.swap(0, Ordering::AcqRel) == 0 {
            return false;
        }
        self.backoff.store(self.first_backoff, Ordering::Relaxed);
        true
    }

    /// A call failed; the back-off when that opened the breaker.
    pub(super) fn failed(&self) -> Option<Duration> {
        if self.is_open() {
            // A failed probe: wait twice as long before the next.
            let backoff = (self.backoff.load(Ordering::Relaxed) * 2).min(self.max_backoff);
            self.backoff.store(backoff, Ordering::Relaxed);
            self.open_until.store(self.now() + backoff, Ordering::Release);
            return None;
        }
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures < self.threshold {
            return None;
        }
        self.failures.store(0, Ordering::Relaxed);
        let backoff = self.backoff.load(Ordering::Relaxed);
        self.open_until.store(self.now() + backoff, Ordering::Release);
        self.opened.fetch_add(1, Ordering::Relaxed);
        Some(Duration::from_micros(backoff))
    }

    /// How long until the store is called again (zero while closed).
    pub(super) fn until_probe(&self) -> Duration {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Duration::from_micros(self.first_backoff);
        }
        Duration::from_micros(until.saturating_sub(self.now()))
    }
}
