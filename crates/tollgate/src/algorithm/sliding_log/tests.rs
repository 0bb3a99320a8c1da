use super::*;

const T0: u64 = 1_700_000_000_000_000;

/// Runs a check and commits it, as a store does.
fn check(log: &SlidingLog, state: &mut SlidingLogState, now: u64, cost: u64) -> Decision {
    let step = log.check(Some(state), now, cost);
    if let Some(change) = step.change {
        state.apply(change);
    }
    step.decision
}

/// The entries as `(instant, units)` pairs.
fn entries(state: &SlidingLogState) -> Vec<(u64, u64)> {
    (0..state.entries.len())
        .map(|index| (state.entries[index].0, state.through(index) - state.before(index)))
        .collect()
}

#[test]
fn admissions_at_one_instant_merge() {
    let log = SlidingLog {
        limit: 10,
        window: 1_000,
    };
    let mut state = SlidingLogState::default();
    check(&log, &mut state, T0, 2);
    check(&log, &mut state, T0, 3);
    check(&log, &mut state, T0 + 1, 1);
    assert_eq!(entries(&state), [(T0, 5), (T0 + 1, 1)]);
}

#[test]
fn an_earlier_clock_stamps_at_the_newest_instant() {
    let log = SlidingLog {
        limit: 10,
        window: 1_000,
    };
    let mut state = SlidingLogState::default();
    check(&log, &mut state, T0, 1);
    check(&log, &mut state, T0 + 500, 2);
    // The clock goes back 300 µs: the entry joins the newest one.
    let decision = check(&log, &mut state, T0 + 200, 3);
    assert!(decision.allowed);
    assert_eq!(decision.remaining, 4);
    assert_eq!(decision.reset_after.as_micros(), 1_300);
    assert_eq!(entries(&state), [(T0, 1), (T0 + 500, 5)]);
    // Those units leave with the newest entry, not 300 µs before it.
    assert_eq!(log.available(Some(&state), T0 + 1_000), 5);
    assert_eq!(log.available(Some(&state), T0 + 1_499), 5);
    assert_eq!(log.available(Some(&state), T0 + 1_500), 10);
    // Back again, the oldest entry still live: the newest grows, nothing
    // is slotted in before it.
    check(&log, &mut state, T0 + 100, 1);
    assert_eq!(entries(&state), [(T0, 1), (T0 + 500, 6)]);
    // Forward again: the oldest has left, a new entry follows the newest.
    check(&log, &mut state, T0 + 1_200, 1);
    assert_eq!(entries(&state), [(T0 + 500, 6), (T0 + 1_200, 1)]);
}

#[test]
fn entries_that_left_the_window_are_dropped_on_admission() {
    let log = SlidingLog {
        limit: 100,
        window: 1_000,
    };
    let mut state = SlidingLogState::default();
    for i in 0..10 {
        check(&log, &mut state, T0 + i * 100, i + 1);
    }
    // At T0 + 1_450 the entries at T0 .. T0 + 400 have left.
    assert_eq!(log.available(Some(&state), T0 + 1_450), 100 - (6 + 7 + 8 + 9 + 10));
    // A peek and a denial keep them; an admission drops them.
    check(&log, &mut state, T0 + 1_450, 0);
    check(&log, &mut state, T0 + 1_450, 100);
    assert_eq!(state.entries.len(), 10);
    check(&log, &mut state, T0 + 1_450, 1);
    assert_eq!(
        entries(&state),
        [
            (T0 + 500, 6),
            (T0 + 600, 7),
            (T0 + 700, 8),
            (T0 + 800, 9),
            (T0 + 900, 10),
            (T0 + 1_450, 1)
        ]
    );
    // Everything gone: the next admission leaves one entry.
    let decision = check(&log, &mut state, T0 + 10_000, 4);
    assert_eq!(decision.remaining, 96);
    assert_eq!(entries(&state), [(T0 + 10_000, 4)]);
}

#[test]
fn a_log_of_fifty_thousand_live_entries_decides_exactly() {
    const LIVE: u64 = 50_000;
    // One entry every 2 µs, unit costs but every tenth entry weighs 3.
    let log = SlidingLog {
        limit: 70_000,
        window: 2 * LIVE,
    };
    let weight = |i: u64| if i.is_multiple_of(10) { 3 } else { 1 };
    let mut state = SlidingLogState::default();
    for i in 0..LIVE {
        let decision = check(&log, &mut state, T0 + 2 * i, weight(i));
        assert!(decision.allowed, "entry {i}");
    }
    let held: u64 = (0..LIVE).map(weight).sum();
    assert_eq!(held, 60_000);
    let now = T0 + 2 * LIVE - 1;
    assert_eq!(log.available(Some(&state), now), 10_000);
    // 20 000 more need 10 000 units to leave: entries 0..=7_499 hold
    // 750 · 3 + 6_750 = 9_000 units, and entries 7_500..=8_333 hold
    // 84 · 3 + 750 = 1_002 more, 1_000 of them through entry 8_331.
    let denied = check(&log, &mut state, now, 20_000);
    assert!(!denied.allowed);
    assert_eq!(denied.remaining, 10_000);
    let retry_after = denied.retry_after.unwrap().as_micros() as u64;
    assert_eq!(now + retry_after, T0 + 2 * 8_331 + 2 * LIVE);
    assert_eq!(
        denied.reset_after.as_micros() as u64,
        T0 + 2 * (LIVE - 1) + 2 * LIVE - now
    );
    assert_eq!(state.entries.len() as u64, LIVE, "a denial changed the log");
    // One microsecond early is not enough; retry_after is.
    assert!(!log.check(Some(&state), now + retry_after - 1, 20_000).decision.allowed);
    let later = check(&log, &mut state, now + retry_after, 20_000);
    assert!(later.allowed);
    assert_eq!(later.remaining, 0);
    // 8_332 entries left the window: an admission trims TRIM_STEP of
    // them (the rest stay, known to have left) and adds one.
    assert_eq!(state.entries.len() as u64, LIVE - TRIM_STEP as u64 + 1);
    // Sliding on: each admission trims what it may and adds one; the
    // backlog is gone well before the 1 000th.
    for i in 0..1_000 {
        let at = now + retry_after + 2 + 2 * i;
        let freed = weight(8_332 + i);
        let decision = check(&log, &mut state, at, freed);
        assert!(decision.allowed, "slide {i}");
        assert_eq!(decision.remaining, 0, "slide {i}");
    }
    assert_eq!(state.entries.len() as u64, LIVE - 8_332 + 1);
}

#[test]
fn retry_after_counts_units_not_entries() {
    let log = SlidingLog {
        limit: 10,
        window: 1_000,
    };
    let mut state = SlidingLogState::default();
    check(&log, &mut state, T0, 4);
    check(&log, &mut state, T0 + 10, 4);
    check(&log, &mut state, T0 + 20, 2);
    // 5 more need 5 to leave: the first two entries.
    let decision = log.check(Some(&state), T0 + 30, 5).decision;
    assert_eq!(decision.retry_after.unwrap().as_micros(), 1_010 - 30);
    // 4 need exactly the first.
    let decision = log.check(Some(&state), T0 + 30, 4).decision;
    assert_eq!(decision.retry_after.unwrap().as_micros(), 1_000 - 30);
    // More than the limit: never.
    assert_eq!(log.check(Some(&state), T0 + 30, 11).decision.retry_after, None);
}
