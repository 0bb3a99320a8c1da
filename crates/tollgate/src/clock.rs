//! Time enters through one door: the [`Clock`].
//!
//! Every timestamp is an integer count of microseconds since the Unix epoch,
//! so that processes on different machines (and Redis, whose `TIME` answers in
//! microseconds) agree on window boundaries without float drift.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// An instant, as whole microseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The Unix epoch.
    pub const EPOCH: Self = Self(0);

    /// An instant `micros` microseconds after the Unix epoch.
    pub const fn from_micros(micros: u64) -> Self {
        Self(micros)
    }

    /// Microseconds since the Unix epoch.
    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// This instant moved later by `duration` (saturating).
    #[must_use]
    pub fn after(self, duration: Duration) -> Self {
        Self(self.0.saturating_add(micros(duration)))
    }
}

/// Whole microseconds in `duration`, saturating at `u64::MAX`.
pub(crate) fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// A boxed future, as [`Clock::sleep`] returns.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// The source of time for the in-process store and for waiting.
///
/// Implementations must be cheap: `now` is read once per decision.
pub trait Clock: Send + Sync + 'static {
    /// The current instant.
    fn now(&self) -> Timestamp;

    /// Waits for `duration` on this clock. The system clock sleeps on tokio's
    /// timer; a [`ManualClock`] moves itself forward and returns at once.
    fn sleep(&self, duration: Duration) -> Sleep {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// The wall clock of this machine.
///
/// Reading the wall clock (`clock_gettime`) costs tens of nanoseconds, as much
/// as a whole decision of the memory store; this clock reads the CPU's time
/// stamp counter instead (via `quanta`) and anchors it to the wall clock once
/// per second per thread, so it follows NTP adjustments within a second and
/// costs a few nanoseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

/// How often a thread re-reads the wall clock.
const REANCHOR_EVERY: Duration = Duration::from_secs(1);

thread_local! {
    /// `(counter reading, wall time in µs)` at this thread's last anchoring.
    static ANCHOR: std::cell::Cell<Option<(quanta::Instant, u64)>> = const { std::cell::Cell::new(None) };
}

fn wall_clock() -> u64 {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    micros(since_epoch)
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Timestamp {
        let counter = quanta::Instant::now();
        ANCHOR.with(|anchor| match anchor.get() {
            Some((then, wall)) if counter.saturating_duration_since(then) < REANCHOR_EVERY => {
                Timestamp(wall + micros(counter.saturating_duration_since(then)))
            }
            _ => {
                let wall = wall_clock();
                anchor.set(Some((counter, wall)));
                Timestamp(wall)
            }
        })
    }
}

/// A clock that moves only when told to: for tests, simulations and replays.
///
/// Clones share the same time. [`Clock::sleep`] advances it by the duration,
/// so code that waits runs instantly and deterministically.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(start.0)),
        }
    }

    /// Moves the clock to `instant` (it may go backwards; the algorithms then
    /// treat newer state conservatively).
    pub fn set(&self, instant: Timestamp) {
        self.now.store(instant.0, Ordering::SeqCst);
    }

    /// Moves the clock forward by `duration`.
    pub fn advance(&self, duration: Duration) {
        self.now.fetch_add(micros(duration), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.now.load(Ordering::SeqCst))
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        self.advance(duration);
        Box::pin(std::future::ready(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(Timestamp::from_micros(10));
        assert_eq!(clock.now(), Timestamp::from_micros(10));
        clock.advance(Duration::from_millis(2));
        assert_eq!(clock.now(), Timestamp::from_micros(2_010));
        let shared = clock.clone();
        shared.set(Timestamp::from_micros(5));
        assert_eq!(clock.now(), Timestamp::from_micros(5));
    }

    #[test]
    fn sleeping_on_a_manual_clock_advances_it() {
        let clock = ManualClock::new(Timestamp::EPOCH);
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(clock.sleep(Duration::from_secs(3)));
        assert_eq!(clock.now(), Timestamp::from_micros(3_000_000));
    }

    #[test]
    fn system_clock_follows_the_wall_clock() {
        let before = wall_clock();
        let now = SystemClock.now().as_micros();
        let after = wall_clock();
        assert!(now > 1_577_836_800_000_000, "after 2020");
        // The counter-based reading lies between two wall readings (1 ms of slack
        // for counter and wall clock disagreeing within a second).
        assert!(before <= now + 1_000 && now <= after + 1_000, "{before} {now} {after}");
    }
}
