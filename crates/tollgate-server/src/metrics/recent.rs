//! Decision latency over the last minute, for the console's overview: six
//! slots of ten seconds, each a count per histogram bucket (the same
//! buckets as `/metrics`), written with one atomic add per request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Buckets: 10 µs doubling, 20 of them (as `/metrics`'s histogram), and
/// one above.
const BUCKETS: usize = 21;
/// Slots of [`SLOT_SECS`], the last minute.
const SLOTS: usize = 6;
const SLOT_SECS: u64 = 10;

/// One slot: the ten seconds it counts (their start, s since the epoch)
/// and its counts.
#[derive(Default)]
struct Slot {
    since: AtomicU64,
    counts: [AtomicU64; BUCKETS],
}

/// The last minute's decision latencies, bucketed.
#[derive(Default)]
pub struct RecentLatency {
    slots: [Slot; SLOTS],
}

/// The upper bound of bucket `index` (the last: above every bound).
fn bound(index: usize) -> Duration {
    Duration::from_micros(10u64 << index.min(BUCKETS - 2))
}

impl RecentLatency {
    /// Counts one request that took `elapsed`, at `now_secs`.
    pub fn record(&self, elapsed: Duration, now_secs: u64) {
        let start = now_secs - now_secs % SLOT_SECS;
        let slot = &self.slots[usize::try_from(start / SLOT_SECS).unwrap_or(0) % SLOTS];
        let since = slot.since.load(Ordering::Relaxed);
        if since != start
            && slot
                .since
                .compare_exchange(since, start, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            // A slot ten seconds old is begun again (a count racing in
            // meanwhile may land in either).
            for count in &slot.counts {
                count.store(0, Ordering::Relaxed);
            }
        }
        let index = (0..BUCKETS - 1)
            .find(|&index| elapsed <= bound(index))
            .unwrap_or(BUCKETS - 1);
        slot.counts[index].fetch_add(1, Ordering::Relaxed);
    }

    /// The 99th percentile of the last minute's requests at `now_secs` (the
    /// upper bound of its bucket), and how many there were; `None` when none.
    pub fn p99(&self, now_secs: u64) -> Option<(Duration, u64)> {
        let oldest = now_secs.saturating_sub(SLOTS as u64 * SLOT_SECS);
        let mut counts = [0u64; BUCKETS];
        for slot in &self.slots {
            if slot.since.load(Ordering::Relaxed) > oldest {
                for (sum, count) in counts.iter_mut().zip(&slot.counts) {
                    *sum += count.load(Ordering::Relaxed);
                }
            }
        }
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = total - total / 100;
        let mut seen = 0;
        let index = counts
            .iter()
            .position(|&count| {
                seen += count;
                seen >= rank
            })
            .unwrap_or(BUCKETS - 1);
        Some((bound(index), total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_p99_is_the_bucket_holding_the_99th_percentile_of_the_last_minute() {
        let recent = RecentLatency::default();
        assert_eq!(recent.p99(1_000), None);
        for _ in 0..99 {
            recent.record(Duration::from_micros(30), 1_000);
        }
        recent.record(Duration::from_millis(3), 1_005);
        // 100 requests: the 99th is among the fast ones (≤ 40 µs).
        assert_eq!(recent.p99(1_005), Some((Duration::from_micros(40), 100)));
        for _ in 0..10 {
            recent.record(Duration::from_millis(3), 1_015);
        }
        // 110: the slow ones reach the 99th (≤ 5.12 ms).
        assert_eq!(recent.p99(1_015), Some((Duration::from_micros(5_120), 110)));
        // A minute later, only what came since counts.
        recent.record(Duration::from_micros(15), 1_075);
        assert_eq!(recent.p99(1_075), Some((Duration::from_micros(20), 1)));
    }
}
