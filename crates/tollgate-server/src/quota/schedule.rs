//! When each step of an interval runs: the same instants on every replica,
//! intervals being aligned on the clock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// When, into its interval, a replica adds its demands; reads everyone's and
/// the budget; takes the blocks of its Envoys under the level; and those of
/// its Envoys at the level (see the module's steps).
pub(super) const ADD_AT: f64 = 0.1;
pub(super) const READ_AT: f64 = 0.25;
pub(super) const TAKE_AT: f64 = 0.4;
pub(super) const TAKE_CAPPED_AT: f64 = 0.5;

/// How far `now` is into its interval, from 0 to 1.
pub(super) fn phase(now: SystemTime, interval: Duration) -> f64 {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
    let length = interval.as_nanos().max(1);
    (since % length) as f64 / length as f64
}

/// The start of the next interval after `now`, interval boundaries being
/// multiples of `interval` since the epoch (so that replicas agree).
pub(super) fn next_start(now: SystemTime, interval: Duration) -> SystemTime {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
    let length = interval.as_nanos().max(1);
    let next = (since / length + 1) * length;
    UNIX_EPOCH + Duration::from_nanos(u64::try_from(next).unwrap_or(u64::MAX))
}

pub(super) async fn sleep_until(at: SystemTime) {
    if let Ok(wait) = at.duration_since(SystemTime::now()) {
        tokio::time::sleep(wait).await;
    }
}
