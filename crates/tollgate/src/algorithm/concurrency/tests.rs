use super::*;

const T0: u64 = 1_700_000_000_000_000;

fn acquire(limit: &Concurrency, state: &mut ConcurrencyState, now: u64, cost: u64, id: &str) -> Decision {
    let step = limit.acquire(Some(state), now, cost, Some(id));
    if let Some(change) = step.change {
        state.apply(change);
    }
    step.decision
}

fn release(limit: &Concurrency, state: &mut ConcurrencyState, now: u64, id: &str) -> Decision {
    let step = limit.release(Some(state), now, id);
    if let Some(change) = step.change {
        state.apply(change);
    }
    step.decision
}

/// The leases held, as `(name, expires, cost)`, soonest to expire first;
/// checks that the two indexes and the total agree.
fn leases(state: &ConcurrencyState) -> Vec<(String, u64, u64)> {
    let leases: Vec<(String, u64, u64)> = state
        .by_expiry
        .iter()
        .map(|(&(expires, _), (name, cost))| (name.to_string(), expires, *cost))
        .collect();
    assert_eq!(state.by_name.len(), leases.len());
    for (name, expires, _) in &leases {
        assert_eq!(state.by_name.get(name.as_str()).map(|key| key.0), Some(*expires));
    }
    assert_eq!(state.held, leases.iter().map(|&(_, _, cost)| cost).sum::<u64>());
    leases
}

#[test]
fn renewal_release_and_expiry_with_costs() {
    let limit = Concurrency { limit: 10, ttl: 1_000 };
    let mut state = ConcurrencyState::default();
    assert!(acquire(&limit, &mut state, T0, 3, "a").allowed);
    assert!(acquire(&limit, &mut state, T0 + 100, 4, "b").allowed);
    let decision = acquire(&limit, &mut state, T0 + 200, 2, "c");
    assert_eq!(decision.remaining, 1);
    assert_eq!(decision.reset_after.as_micros(), 1_000);

    // Renewing "a" with 4 units: its 3 are given back first.
    let decision = acquire(&limit, &mut state, T0 + 300, 4, "a");
    assert!(decision.allowed);
    assert_eq!(decision.remaining, 0);
    assert_eq!(
        leases(&state),
        [
            ("b".to_owned(), T0 + 1_100, 4),
            ("c".to_owned(), T0 + 1_200, 2),
            ("a".to_owned(), T0 + 1_300, 4),
        ]
    );

    // 3 more units: "b" (4) must end first; 5 more: "b" and "c" (6).
    let denied = limit.acquire(Some(&state), T0 + 400, 3, Some("d")).decision;
    assert_eq!(denied.retry_after.unwrap().as_micros(), 700);
    assert_eq!(denied.reset_after.as_micros(), 900);
    let denied = limit.acquire(Some(&state), T0 + 400, 5, Some("d")).decision;
    assert_eq!(denied.retry_after.unwrap().as_micros(), 800);
    // Renewing "c" for 6: its own 2 do not count, "b" must end.
    let denied = limit.acquire(Some(&state), T0 + 400, 6, Some("c")).decision;
    assert_eq!(denied.retry_after.unwrap().as_micros(), 700);
    // Renewing "a" for 10 needs all the others gone.
    let denied = limit.acquire(Some(&state), T0 + 400, 10, Some("a")).decision;
    assert_eq!(denied.retry_after.unwrap().as_micros(), 800);

    // Releasing "c" frees its 2 units; releasing it again changes nothing.
    let decision = release(&limit, &mut state, T0 + 500, "c");
    assert_eq!(decision.remaining, 2);
    assert_eq!(decision.reset_after.as_micros(), 800);
    assert_eq!(release(&limit, &mut state, T0 + 500, "c"), decision);
    assert_eq!(leases(&state).len(), 2);

    // At T0 + 1_100 "b" has expired; it counts for nothing but stays
    // until an acquire or a release drops it.
    assert_eq!(limit.available(Some(&state), T0 + 1_099), 2);
    assert_eq!(limit.available(Some(&state), T0 + 1_100), 6);
    assert!(!limit.acquire(Some(&state), T0 + 1_100, 7, Some("d")).decision.allowed);
    assert_eq!(leases(&state).len(), 2);
    let decision = acquire(&limit, &mut state, T0 + 1_100, 6, "d");
    assert_eq!(decision.remaining, 0);
    assert_eq!(decision.reset_after.as_micros(), 1_000);
    assert_eq!(
        leases(&state),
        [("a".to_owned(), T0 + 1_300, 4), ("d".to_owned(), T0 + 2_100, 6)]
    );

    // An expired lease released late frees nothing more.
    let decision = release(&limit, &mut state, T0 + 1_300, "a");
    assert_eq!(decision.remaining, 4);
    assert_eq!(leases(&state), [("d".to_owned(), T0 + 2_100, 6)]);
    // The last one gone: nothing left to say.
    let decision = release(&limit, &mut state, T0 + 1_400, "d");
    assert_eq!(decision.remaining, 10);
    assert_eq!(decision.reset_after.as_micros(), 0);
    assert!(leases(&state).is_empty());
}

#[test]
fn many_leases_held() {
    const HELD: u64 = 50_000;
    let limit = Concurrency {
        limit: 2 * HELD,
        ttl: 10 * HELD,
    };
    let mut state = ConcurrencyState::default();
    // Lease i, of 1 unit (2 for every tenth), taken at T0 + i.
    let cost = |i: u64| if i.is_multiple_of(10) { 2 } else { 1 };
    for i in 0..HELD {
        assert!(acquire(&limit, &mut state, T0 + i, cost(i), &format!("lease-{i}")).allowed);
    }
    let now = T0 + HELD;
    assert_eq!(limit.available(Some(&state), now), 2 * HELD - 55_000);
    // 50 000 more units need 5 000 to be freed: leases 0..=4_544 hold
    // 4_545 + 455 = 5_000.
    let denied = limit.acquire(Some(&state), now, HELD, Some("big")).decision;
    assert_eq!(
        now + denied.retry_after.unwrap().as_micros() as u64,
        T0 + 4_544 + 10 * HELD
    );
    // Renewing and releasing in the middle of the crowd.
    assert!(acquire(&limit, &mut state, now, 5, "lease-20001").allowed);
    assert_eq!(limit.available(Some(&state), now), 2 * HELD - 55_000 - 4);
    let decision = release(&limit, &mut state, now, "lease-30000");
    assert_eq!(decision.remaining, 2 * HELD - 55_000 - 4 + 2);
    assert_eq!(leases(&state).len() as u64, HELD - 1);
    // Half of them expire (not the renewed one): the next acquire drops those.
    let later = T0 + 10 * HELD + HELD / 2;
    let live = leases(&state)
        .iter()
        .filter(|&&(_, expires, _)| expires > later)
        .count();
    let held: u64 = leases(&state).iter().filter(|l| l.1 > later).map(|l| l.2).sum();
    assert_eq!(limit.available(Some(&state), later), 2 * HELD - held);
    let decision = acquire(&limit, &mut state, later, 1, "late");
    assert_eq!(decision.remaining, 2 * HELD - held - 1);
    let left = leases(&state);
    assert_eq!(left.len(), live + 1);
    assert!(left.iter().all(|&(_, expires, _)| expires > later));
}
