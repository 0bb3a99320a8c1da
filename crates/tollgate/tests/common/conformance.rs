//! The conformance suite: behaviour every [`Store`] must show, driven with
//! explicit instants so that it runs unchanged against any store.

use std::time::Duration;

use tollgate::{Decision, Limit, Limiter, Op, Policy, Request, Spread, Store, Subject, Timestamp};

/// An instant that is not aligned to any window.
pub const T0: u64 = 1_700_000_000_250_000;

async fn decide<S: Store>(limiter: &Limiter<S>, subject: &Subject, op: Op, cost: u64, at: u64) -> tollgate::Outcome {
    limiter
        .decide(subject, &Request::new(op, cost).at(Timestamp::from_micros(at)))
        .await
        .expect("decision")
}

async fn check<S: Store>(limiter: &Limiter<S>, subject: &Subject, cost: u64, at: u64) -> Decision {
    decide(limiter, subject, Op::Check, cost, at).await.decision
}

/// A request that one limit denies consumes from none.
pub async fn policy_is_all_or_nothing<S: Store>(store: S) {
    let policy = Policy::new([
        ("per_second", Limit::gcra(10, Duration::from_secs(1), 10).unwrap()),
        ("per_minute", Limit::fixed_window(15, Duration::from_secs(60)).unwrap()),
    ])
    .unwrap();
    let limiter = Limiter::new(store, policy);
    let subject = Subject::new("user-1").and("/search");

    // 12 units: per_minute admits (15), per_second denies (burst 10).
    let outcome = decide(&limiter, &subject, Op::Check, 12, T0).await;
    assert!(!outcome.decision.allowed);
    assert_eq!(outcome.granted, 0);
    assert_eq!(outcome.decision.limit, 10, "the denying limit speaks for the policy");
    assert_eq!(outcome.limits.len(), 2);
    assert!(!outcome.limits[0].1.allowed);
    assert!(outcome.limits[1].1.allowed);
    assert_eq!(outcome.limits[1].1.remaining, 15, "per_minute reports as a peek");

    // Nothing was consumed from either.
    let peek = decide(&limiter, &subject, Op::Check, 0, T0).await;
    assert_eq!(peek.limits[0].1.remaining, 10);
    assert_eq!(peek.limits[1].1.remaining, 15);

    // 10 units fit both; then per_minute has 5 left and per_second none.
    let outcome = decide(&limiter, &subject, Op::Check, 10, T0).await;
    assert!(outcome.decision.allowed);
    assert_eq!(outcome.limits[0].1.remaining, 0);
    assert_eq!(outcome.limits[1].1.remaining, 5);
    assert_eq!(
        outcome.decision.remaining, 0,
        "the policy reports its most restrictive limit"
    );

    // A second later per_second is full again, but per_minute denies 6.
    let outcome = decide(&limiter, &subject, Op::Check, 6, T0 + 1_000_000).await;
    assert!(!outcome.decision.allowed);
    assert_eq!(outcome.decision.limit, 15);
    let peek = decide(&limiter, &subject, Op::Check, 0, T0 + 1_000_000).await;
    assert_eq!(peek.limits[0].1.remaining, 10, "per_second untouched by the denial");
}

/// Subjects are independent, and `reset` forgets one without touching another.
pub async fn subjects_are_independent_and_reset_forgets<S: Store>(store: S) {
    let limiter = Limiter::new(store, Limit::fixed_window(2, Duration::from_secs(10)).unwrap());
    let alice = Subject::new("alice");
    let bob = Subject::new("bob");
    assert!(check(&limiter, &alice, 2, T0).await.allowed);
    assert!(!check(&limiter, &alice, 1, T0).await.allowed);
    assert!(check(&limiter, &bob, 1, T0).await.allowed);
    limiter.reset(&alice).await.unwrap();
    assert_eq!(check(&limiter, &alice, 0, T0).await.remaining, 2);
    assert_eq!(check(&limiter, &bob, 0, T0).await.remaining, 1);
}

/// Subjects that differ only by separators or escapes never share state.
pub async fn crafted_subjects_do_not_collide<S: Store>(store: S) {
    let limiter = Limiter::new(store, Limit::fixed_window(1, Duration::from_secs(10)).unwrap());
    let subjects = [
        Subject::new("a:b"),
        Subject::new("a").and("b"),
        Subject::new("a%3Ab"),
        Subject::new("{a}"),
        Subject::new("a}:{b"),
        Subject::new(""),
        Subject::new("").and(""),
        Subject::from_bytes(&[0xff, 0x00]),
        Subject::new("ü"),
        Subject::new("x".repeat(500)),
        Subject::new("x".repeat(501)),
    ];
    for subject in &subjects {
        let decision = check(&limiter, subject, 1, T0).await;
        assert!(decision.allowed, "{subject:?} shared state with an earlier subject");
    }
}

/// `check_at_most` grants what is there; `reserve` books ahead and `wait`s.
pub async fn partial_grants_and_reservations<S: Store>(store: S) {
    let limiter = Limiter::new(
        store.clone(),
        Limit::token_bucket(5, 1, Duration::from_secs(1)).unwrap(),
    );
    let subject = Subject::new("batch");
    let outcome = decide(&limiter, &subject, Op::CheckAtMost, 8, T0).await;
    assert!(outcome.decision.allowed);
    assert_eq!(outcome.granted, 5);
    let outcome = decide(&limiter, &subject, Op::CheckAtMost, 8, T0).await;
    assert!(!outcome.decision.allowed);
    assert_eq!(outcome.granted, 0);
    assert_eq!(outcome.decision.retry_after, Some(Duration::from_secs(1)));

    let limiter = Limiter::new(store, Limit::reservation(10, Duration::from_secs(1), 0).unwrap());
    let reserve = |max_wait| Op::Reserve { max_wait };
    let first = decide(&limiter, &subject, reserve(None), 3, T0).await.decision;
    assert!(first.allowed);
    assert_eq!(first.wait, Duration::ZERO, "the first caller goes at once");
    let second = decide(&limiter, &subject, reserve(None), 1, T0).await.decision;
    assert_eq!(
        second.wait,
        Duration::from_millis(300),
        "and the next pays for its 3 permits"
    );
    let third = decide(&limiter, &subject, reserve(Some(Duration::from_millis(399))), 1, T0)
        .await
        .decision;
    assert!(!third.allowed, "a 400 ms wait is over max_wait");
    assert_eq!(third.retry_after, Some(Duration::from_millis(1)));
}

/// Leases: acquire up to the limit, release frees, expiry frees.
pub async fn leases_are_released_and_expire<S: Store>(store: S) {
    let limiter = Limiter::new(store, Limit::concurrency(2, Duration::from_secs(30)).unwrap());
    let subject = Subject::new("jobs");
    let acquire = |lease: &str| Op::Acquire {
        lease: lease.to_owned(),
        max_wait: None,
    };
    assert_eq!(
        decide(&limiter, &subject, acquire("a"), 1, T0).await.lease.as_deref(),
        Some("a")
    );
    assert!(decide(&limiter, &subject, acquire("b"), 1, T0).await.decision.allowed);
    let denied = decide(&limiter, &subject, acquire("c"), 1, T0 + 1).await.decision;
    assert!(!denied.allowed);
    assert_eq!(denied.retry_after, Some(Duration::from_micros(30_000_000 - 1)));
    decide(&limiter, &subject, Op::Release { lease: "a".into() }, 0, T0 + 2).await;
    assert!(
        decide(&limiter, &subject, acquire("c"), 1, T0 + 3)
            .await
            .decision
            .allowed
    );
    // "b" expires at T0 + 30 s, freeing its slot for "d".
    assert!(
        !decide(&limiter, &subject, acquire("d"), 1, T0 + 29_999_999)
            .await
            .decision
            .allowed
    );
    assert!(
        decide(&limiter, &subject, acquire("d"), 1, T0 + 30_000_000)
            .await
            .decision
            .allowed
    );
}

/// Operations a limit cannot do are errors that name what to use instead.
pub async fn unsupported_operations_are_errors<S: Store>(store: S) {
    let gcra = Limiter::new(store.clone(), Limit::gcra(1, Duration::from_secs(1), 1).unwrap());
    let subject = Subject::new("x");
    let error = gcra
        .decide(
            &subject,
            &Request::new(Op::Reserve { max_wait: None }, 1).at(Timestamp::from_micros(T0)),
        )
        .await
        .unwrap_err();
    assert!(error.is_invalid());
    assert!(error.to_string().contains("reserve needs"), "{error}");
    let leases = Limiter::new(store, Limit::concurrency(1, Duration::from_secs(1)).unwrap());
    let error = leases
        .decide(&subject, &Request::new(Op::Check, 1).at(Timestamp::from_micros(T0)))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("acquire"), "{error}");
}

/// A limit redefined under the same name with another algorithm starts
/// afresh, and so does the old one when it comes back.
pub async fn a_redefined_limit_starts_afresh<S: Store>(store: S) {
    let subject = Subject::new("redefined");
    let log = Policy::new([("x", Limit::sliding_log(2, Duration::from_secs(3600)).unwrap())]).unwrap();
    let gcra = Policy::new([("x", Limit::gcra(1, Duration::from_secs(3600), 5).unwrap())]).unwrap();
    let first = Limiter::new(store.clone(), log.clone());
    assert_eq!(check(&first, &subject, 2, T0).await.remaining, 0);
    let second = Limiter::new(store.clone(), gcra);
    assert_eq!(check(&second, &subject, 1, T0).await.remaining, 4);
    let third = Limiter::new(store, log);
    assert_eq!(check(&third, &subject, 1, T0).await.remaining, 1);
}

/// The same, starting from GCRA (the memory store keeps GCRA states in a
/// table of their own).
pub async fn a_redefined_gcra_limit_starts_afresh<S: Store>(store: S) {
    let subject = Subject::new("redefined");
    let gcra = Policy::new([("x", Limit::gcra(1, Duration::from_secs(3600), 5).unwrap())]).unwrap();
    let window = Policy::new([("x", Limit::fixed_window(3, Duration::from_secs(3600)).unwrap())]).unwrap();
    let first = Limiter::new(store.clone(), gcra.clone());
    assert_eq!(check(&first, &subject, 4, T0).await.remaining, 1);
    let second = Limiter::new(store.clone(), window);
    assert_eq!(check(&second, &subject, 1, T0).await.remaining, 2);
    let third = Limiter::new(store, gcra);
    assert_eq!(check(&third, &subject, 1, T0).await.remaining, 4);
}

/// The same for a GCRA whose emission interval is not whole microseconds
/// (its TAT carries a fraction of one): another algorithm reads its state as
/// none, and a GCRA of another rate reads the TAT in its own ticks.
pub async fn a_redefined_fractional_gcra_limit_starts_afresh<S: Store>(store: S) {
    let subject = Subject::new("redefined");
    // 3 a second: a cell every 333 333⅓ µs.
    let thirds = Policy::new([("x", Limit::gcra(3, Duration::from_secs(1), 5).unwrap())]).unwrap();
    let window = Policy::new([("x", Limit::fixed_window(3, Duration::from_secs(3600)).unwrap())]).unwrap();
    let first = Limiter::new(store.clone(), thirds.clone());
    assert_eq!(check(&first, &subject, 4, T0).await.remaining, 1);
    let second = Limiter::new(store.clone(), window);
    assert_eq!(check(&second, &subject, 1, T0).await.remaining, 2);
    let third = Limiter::new(store.clone(), thirds);
    assert_eq!(check(&third, &subject, 1, T0).await.remaining, 4);
    // 7 a second, burst 5 (7 ticks a µs, 1 000 000 a cell): the TAT, 333 333
    // µs and 1 tick ahead, is 2 333 332 ticks, 2.33 cells of 5: 2 left.
    let sevenths = Policy::new([("x", Limit::gcra(7, Duration::from_secs(1), 5).unwrap())]).unwrap();
    let fourth = Limiter::new(store, sevenths);
    assert_eq!(check(&fourth, &subject, 0, T0).await.remaining, 2);
}

/// A limit is one state per `(subject, name)`, whichever policy decides it:
/// alone, or next to other limits.
pub async fn policies_share_limits_by_name<S: Store>(store: S) {
    let subject = Subject::new("shared");
    let per_second = || ("per_second", Limit::gcra(10, Duration::from_secs(1), 10).unwrap());
    let per_hour = || ("per_hour", Limit::fixed_window(100, Duration::from_secs(3600)).unwrap());
    let alone = Limiter::new(store.clone(), Policy::new([per_second()]).unwrap());
    let hourly = Limiter::new(store.clone(), Policy::new([per_hour()]).unwrap());
    let both = Limiter::new(store, Policy::new([per_second(), per_hour()]).unwrap());
    assert_eq!(check(&alone, &subject, 4, T0).await.remaining, 6);
    assert_eq!(check(&hourly, &subject, 10, T0).await.remaining, 90);
    let outcome = decide(&both, &subject, Op::Check, 5, T0).await;
    assert!(outcome.decision.allowed);
    let remaining: Vec<u64> = outcome.limits.iter().map(|(_, decision)| decision.remaining).collect();
    assert_eq!(remaining, [1, 85]);
    // Denied by the shared GCRA: nothing consumed anywhere.
    assert!(!check(&both, &subject, 2, T0).await.allowed);
    assert_eq!(check(&alone, &subject, 1, T0).await.remaining, 0);
    assert_eq!(check(&hourly, &subject, 0, T0).await.remaining, 85);
}

/// Keys that concatenate to the same bytes stay apart: subject `ab` with
/// limit `c` is not subject `a` with limit `bc`, for short keys and long.
pub async fn subject_and_name_do_not_run_together<S: Store>(store: S) {
    for (long, short) in [("ab", "a"), (&*"x".repeat(40), &*"x".repeat(39))] {
        let one = Limiter::new(
            store.clone(),
            Policy::new([("c", Limit::gcra(1, Duration::from_secs(3600), 3).unwrap())]).unwrap(),
        );
        let other = Limiter::new(
            store.clone(),
            Policy::new([(
                format!("{}c", &long[short.len()..]),
                Limit::gcra(1, Duration::from_secs(3600), 3).unwrap(),
            )])
            .unwrap(),
        );
        assert_eq!(check(&one, &Subject::new(long), 2, T0).await.remaining, 1);
        assert_eq!(check(&other, &Subject::new(short), 1, T0).await.remaining, 2);
        assert_eq!(check(&one, &Subject::new(long), 0, T0).await.remaining, 1);
    }
}

/// A wait beyond what the clock can represent (a Java client's
/// `Long.MAX_VALUE` microseconds, `Duration::MAX`) means "as long as it
/// takes": it is never an error and never overflows into a refusal.
pub async fn huge_waits_are_unbounded<S: Store>(store: S) {
    let huge = [
        Duration::from_micros(i64::MAX as u64),
        Duration::from_micros(u64::MAX),
        Duration::MAX,
    ];
    for (index, max_wait) in huge.into_iter().enumerate() {
        let subject = Subject::new("huge").and(index);
        for limit in [
            Limit::reservation(1, Duration::from_secs(3600), 0).unwrap(),
            Limit::leaky_bucket(1, Duration::from_secs(3600), 10).unwrap(),
        ] {
            let limiter = Limiter::new(store.clone(), limit.clone());
            let subject = subject.clone().and(limit.algorithm());
            let reserve = || Op::Reserve {
                max_wait: Some(max_wait),
            };
            let first = decide(&limiter, &subject, reserve(), 1, T0).await.decision;
            assert!(first.allowed, "{limit:?} {max_wait:?}: {first:?}");
            let second = decide(&limiter, &subject, reserve(), 1, T0).await.decision;
            assert!(second.allowed, "{limit:?} {max_wait:?}: {second:?}");
            assert_eq!(second.wait, Duration::from_secs(3600), "{limit:?}");
            // The same through acquire: a huge max_wait on a shaping limit.
            let third = decide(
                &limiter,
                &subject,
                Op::Acquire {
                    lease: "l".to_owned(),
                    max_wait: Some(max_wait),
                },
                1,
                T0,
            )
            .await
            .decision;
            assert!(third.allowed, "{limit:?} {max_wait:?}: {third:?}");
            assert_eq!(third.wait, Duration::from_secs(7200), "{limit:?}");
        }
        // Limiter::acquire with such a timeout: granted, not an error.
        let limiter = Limiter::new(
            store.clone(),
            Limit::reservation(1, Duration::from_secs(3600), 0).unwrap(),
        );
        let acquired = limiter.acquire(&subject.clone().and("acquire"), 1, max_wait).await;
        assert!(acquired.expect("no error").is_granted(), "{max_wait:?}");
    }
}

/// Every algorithm: a refund of a check's units, at its instant, leaves
/// each limit exactly as a peek saw it before the check; a concurrency
/// limit's refund ends the lease. A refund is never denied.
pub async fn a_refund_undoes_a_check<S: Store>(store: S) {
    let second = Duration::from_secs(1);
    let limits = [
        Limit::fixed_window(5, second).unwrap(),
        Limit::sliding_window(5, second, 10).unwrap(),
        Limit::sliding_log(5, second).unwrap(),
        Limit::token_bucket(5, 1, Duration::from_millis(300)).unwrap(),
        tollgate::LimitSpec::TokenBucket(tollgate::TokenBucketSpec {
            capacity: 5,
            refill: 2,
            interval: second,
            mode: tollgate::Refill::Interval,
            initial: Some(4),
            max_debt: None,
        })
        .build()
        .unwrap(),
        Limit::reservation(7, second, 3).unwrap(),
        Limit::leaky_bucket(7, second, 5).unwrap(),
        Limit::gcra(7, second, 5).unwrap(),
        Limit::concurrency(5, second).unwrap(),
    ];
    for (index, limit) in limits.into_iter().enumerate() {
        let name = limit.algorithm();
        let policy = Policy::new([
            ("limit", limit.clone()),
            ("other", Limit::gcra(1000, second, 100).unwrap()),
        ])
        .unwrap();
        let subject = Subject::new("refund").and(index);
        let at = |offset: u64| Timestamp::from_micros(T0 + offset);
        let lease = || Op::Acquire {
            lease: "taken".to_owned(),
            max_wait: None,
        };
        // A release of a lease nobody holds: every limit reports, as after a refund.
        let peek = |offset| {
            Request::new(
                Op::Release {
                    lease: "nobody".to_owned(),
                },
                0,
            )
            .at(at(offset))
        };
        // Some history first: two units taken a little earlier.
        let op = if limit.is_concurrency() {
            Op::Acquire {
                lease: "earlier".to_owned(),
                max_wait: None,
            }
        } else {
            Op::Check
        };
        let earlier = store
            .decide(&subject, &policy, &Request::new(op, 2).at(at(0)))
            .await
            .unwrap();
        assert!(earlier.decision.allowed, "{name}: {earlier:?}");
        let before = store.decide(&subject, &policy, &peek(40_000)).await.unwrap();
        let op = if limit.is_concurrency() { lease() } else { Op::Check };
        let taken = store
            .decide(&subject, &policy, &Request::new(op, 2).at(at(40_000)))
            .await
            .unwrap();
        assert!(taken.decision.allowed, "{name}: {taken:?}");
        assert_eq!(taken.decided_at, at(40_000), "{name}");
        let lease = limit.is_concurrency().then(|| "taken".to_owned());
        let refund = Request::new(
            Op::Refund {
                at: taken.decided_at,
                lease,
            },
            2,
        )
        .at(at(40_000));
        let refunded = store.decide(&subject, &policy, &refund).await.unwrap();
        assert!(
            refunded.decision.allowed,
            "{name}: a refund is never denied: {refunded:?}"
        );
        assert_eq!(
            refunded.limits, before.limits,
            "{name}: the refund reports as a peek after it"
        );
        let after = store.decide(&subject, &policy, &peek(40_000)).await.unwrap();
        assert_eq!(after.limits, before.limits, "{name}: the refund restores the state");
        // A refund of units taken in a window no longer counted gives nothing back.
        if limit.window().is_some() {
            let late = Request::new(Op::Refund { at: at(0), lease: None }, 2).at(at(2_500_000));
            let taken = store
                .decide(&subject, &policy, &Request::new(Op::Check, 1).at(at(2_500_000)))
                .await
                .unwrap();
            let refunded = store.decide(&subject, &policy, &late).await.unwrap();
            assert_eq!(refunded.limits[0].1, taken.limits[0].1, "{name}: nothing to give back");
        }
    }
}

/// A decision over limits of several subjects is all-or-nothing: when one
/// subject's limit denies, the others keep what they had.
pub async fn a_spread_decision_is_all_or_nothing<S: Store>(store: S) {
    let minute = Duration::from_secs(60);
    let subjects = [
        Subject::new("spread").and("ip").and("203.0.113.7"),
        Subject::new("spread").and("user").and("alice"),
        Subject::new("spread").and("path").and("/search"),
    ];
    let limits = [
        Limit::fixed_window(10, minute).unwrap(),
        Limit::gcra(10, minute, 5).unwrap(),
        Limit::sliding_log(3, minute).unwrap(),
    ];
    let at = Timestamp::from_micros(T0);
    let decide = |cost| {
        let store = store.clone();
        let mut rows = Spread::builder();
        for (subject, limit) in subjects.iter().zip(&limits) {
            rows.row(subject.clone(), "rule", limit.clone(), cost);
        }
        let spread = rows.build().unwrap().at(at);
        async move { store.decide_spread(&spread, Op::Check).await.unwrap() }
    };
    let first = decide(2).await;
    assert!(first.decision.allowed, "{first:?}");
    assert_eq!(first.limits.len(), 3);
    assert_eq!(
        first.limits.iter().map(|(_, d)| d.remaining).collect::<Vec<_>>(),
        [8, 3, 1]
    );
    // 2 more: the log (1 left) denies; the others give their units back.
    let denied = decide(2).await;
    assert!(!denied.decision.allowed, "{denied:?}");
    assert_eq!(denied.granted, 0);
    assert_eq!(
        denied
            .limits
            .iter()
            .map(|(_, d)| (d.allowed, d.remaining))
            .collect::<Vec<_>>(),
        [(true, 8), (true, 3), (false, 1)]
    );
    let peek = decide(0).await;
    assert_eq!(
        peek.limits.iter().map(|(_, d)| d.remaining).collect::<Vec<_>>(),
        [8, 3, 1]
    );
    // One unit fits all three.
    assert!(decide(1).await.decision.allowed);
    // One subject's limit given twice is one row, weighing the sum.
    let mut rows = Spread::builder();
    let twice = Subject::new("spread").and("twice");
    let first = rows.row(twice.clone(), "rule", Limit::gcra(1, minute, 3).unwrap(), 1);
    let again = rows.row(twice, "rule", Limit::gcra(1, minute, 3).unwrap(), 2);
    assert_eq!((first, again), (0, 0));
    let both = store
        .decide_spread(&rows.build().unwrap().at(at), Op::Check)
        .await
        .unwrap();
    assert_eq!(both.limits.len(), 1);
    assert_eq!(
        (both.decision.allowed, both.decision.remaining),
        (true, 0),
        "1 + 2 of 3"
    );
}

/// Many leases ending before the next decision are all given back, whether
/// each held one unit or some held more; the ones still running stay held.
pub async fn many_ended_leases_are_given_back<S: Store>(store: S) {
    let limiter = Limiter::new(store, Limit::concurrency(1_000, Duration::from_secs(1)).unwrap());
    for (name, heavy) in [("ones", 0), ("mixed", 1)] {
        let subject = Subject::new("many-leases").and(name);
        // 150 leases (more than a page) at distinct instants; with "mixed",
        // every tenth holds 3 units.
        let mut held = 0;
        for i in 0..150u64 {
            let cost = if heavy == 1 && i % 10 == 0 { 3 } else { 1 };
            let op = Op::Acquire {
                lease: format!("lease-{i}"),
                max_wait: None,
            };
            assert!(decide(&limiter, &subject, op, cost, T0 + i).await.decision.allowed);
            held += cost;
        }
        assert_eq!(check(&limiter, &subject, 0, T0 + 150).await.remaining, 1_000 - held);
        // The first 100 have ended one second after they began; 50 still run.
        let at = T0 + 1_000_000 + 99;
        let still: u64 = (100..150u64)
            .map(|i| if heavy == 1 && i % 10 == 0 { 3 } else { 1 })
            .sum();
        let op = Op::Acquire {
            lease: "after".to_owned(),
            max_wait: None,
        };
        let after = decide(&limiter, &subject, op, 1, at).await.decision;
        assert!(after.allowed, "{name}");
        assert_eq!(after.remaining, 1_000 - still - 1, "{name}");
        // Once every lease has ended only "after" is held.
        assert_eq!(
            check(&limiter, &subject, 0, T0 + 1_000_000 + 150).await.remaining,
            999,
            "{name}"
        );
    }
}

/// Runs the whole suite, each test on a fresh store made by `make`.
pub async fn run_all<S: Store, F: std::future::Future<Output = S>>(make: impl Fn() -> F) {
    policy_is_all_or_nothing(make().await).await;
    subjects_are_independent_and_reset_forgets(make().await).await;
    crafted_subjects_do_not_collide(make().await).await;
    partial_grants_and_reservations(make().await).await;
    leases_are_released_and_expire(make().await).await;
    many_ended_leases_are_given_back(make().await).await;
    unsupported_operations_are_errors(make().await).await;
    a_redefined_limit_starts_afresh(make().await).await;
    a_redefined_gcra_limit_starts_afresh(make().await).await;
    a_redefined_fractional_gcra_limit_starts_afresh(make().await).await;
    policies_share_limits_by_name(make().await).await;
    subject_and_name_do_not_run_together(make().await).await;
    huge_waits_are_unbounded(make().await).await;
    a_refund_undoes_a_check(make().await).await;
    a_spread_decision_is_all_or_nothing(make().await).await;
    estimates_settle_to_the_actual(make().await).await;
    usage_is_recorded_past_the_limit(make().await).await;
    calendar_windows_follow_the_zone(make().await).await;
}

/// A day in Europe/Paris across the spring DST change (23 hours) and a
/// month of 28 days in Asia/Tokyo: a window's count lasts exactly until the
/// zone's midnight, and `reset_after` says so.
pub async fn calendar_windows_follow_the_zone<S: Store>(store: S) {
    use tollgate::Period;
    // 2026-03-29 10:00 UTC (12:00 CEST); Paris's midnight is 22:00 UTC.
    let noon = 1_774_778_400_000_000;
    let midnight = 1_774_821_600_000_000;
    let day = Limiter::new(
        store.clone(),
        Limit::calendar_window(2, Period::Day, "Europe/Paris").unwrap(),
    );
    let subject = Subject::new("calendar").and("day");
    let first = check(&day, &subject, 2, noon).await;
    assert!(first.allowed);
    assert_eq!(
        first.reset_after,
        Duration::from_micros(midnight - noon),
        "until Paris's midnight"
    );
    let over = check(&day, &subject, 1, midnight - 1).await;
    assert!(!over.allowed);
    assert_eq!(over.retry_after, Some(Duration::from_micros(1)));
    assert!(check(&day, &subject, 2, midnight).await.allowed, "a new day in Paris");

    // February 2027 in Tokyo: 28 days, ending 2027-02-28T15:00Z.
    let month = Limiter::new(store, Limit::calendar_window(10, Period::Month, "Asia/Tokyo").unwrap());
    let subject = Subject::new("calendar").and("month");
    let february = 1_801_407_600_000_000; // 2027-01-31T15:00:00Z: Tokyo's 1 February
    let march = february + 28 * 86_400_000_000;
    let taken = decide(&month, &subject, Op::Record, 25, february + 5).await;
    assert!(!taken.decision.allowed, "25 of 10: recorded all the same");
    assert_eq!(taken.decision.reset_after, Duration::from_micros(march - february - 5));
    assert!(
        !check(&month, &subject, 0, march - 1).await.allowed,
        "over until the month ends"
    );
    assert!(check(&month, &subject, 10, march).await.allowed, "March in Tokyo");
}

/// Take an estimate, then settle the actual: the unused part comes back,
/// an excess is recorded, an exact estimate costs no call; what is never
/// settled stays at its estimate. (The store's own clock: limits of an hour,
/// so that nothing refills meanwhile.)
pub async fn estimates_settle_to_the_actual<S: Store>(store: S) {
    let hour = Duration::from_secs(3600);
    for limit in [
        Limit::sliding_log(1000, hour).unwrap(),
        Limit::gcra(1000, hour, 1000).unwrap(),
        Limit::token_bucket(1000, 1000, hour).unwrap(),
    ] {
        let name = limit.algorithm();
        let limiter = Limiter::new(store.clone(), limit);
        let subject = Subject::new("settle").and(name);
        let remaining = |estimated: &tollgate::Estimated<S>| estimated.decision().remaining;

        let first = limiter.estimate(&subject, 100).await.unwrap();
        assert_eq!(remaining(&first), 900, "{name}");
        let tollgate::Estimated::Admitted(first) = first else {
            panic!("{name}: admitted")
        };
        assert_eq!(first.settle(30).await.unwrap().remaining, 970, "{name}: 70 came back");

        let tollgate::Estimated::Admitted(second) = limiter.estimate(&subject, 100).await.unwrap() else {
            panic!("{name}: admitted")
        };
        let after = second.settle(250).await.unwrap();
        assert_eq!(after.remaining, 720, "{name}: 150 more recorded");

        let tollgate::Estimated::Admitted(exact) = limiter.estimate(&subject, 100).await.unwrap() else {
            panic!("{name}: admitted")
        };
        let admitted = exact.decision().clone();
        assert_eq!(exact.settle(100).await.unwrap(), admitted, "{name}: nothing to settle");

        // Never settled: the estimate stays taken.
        drop(limiter.estimate(&subject, 20).await.unwrap());
        assert_eq!(limiter.peek(&subject).await.unwrap().remaining, 600, "{name}");
        let denied = limiter.estimate(&subject, 700).await.unwrap();
        assert!(!denied.is_admitted(), "{name}: 700 do not fit in 600");
        assert_eq!(
            limiter.peek(&subject).await.unwrap().remaining,
            600,
            "{name}: a denial takes nothing"
        );
    }
}

/// Usage that already happened is counted whether or not it fits; a
/// concurrency limit refuses it by name.
pub async fn usage_is_recorded_past_the_limit<S: Store>(store: S) {
    let limiter = Limiter::new(
        store.clone(),
        Limit::fixed_window(1000, Duration::from_secs(60)).unwrap(),
    );
    let subject = Subject::new("record");
    let at = |ms: u64| T0 + ms * 1000;
    assert!(
        decide(&limiter, &subject, Op::Record, 800, at(0))
            .await
            .decision
            .allowed
    );
    let over = decide(&limiter, &subject, Op::Record, 800, at(1)).await;
    assert!(!over.decision.allowed, "did not fit");
    assert_eq!(over.granted, 800, "counted all the same");
    assert!(
        !check(&limiter, &subject, 0, at(2)).await.allowed,
        "over: even a peek is refused"
    );
    // The window (aligned on the epoch) ends: the count is gone.
    let end = at(2) - at(2) % 60_000_000 + 60_000_000;
    assert!(check(&limiter, &subject, 1000, end).await.allowed);

    let policy = Policy::new([
        ("tokens", Limit::fixed_window(1000, Duration::from_secs(60)).unwrap()),
        ("in_flight", Limit::concurrency(5, Duration::from_secs(60)).unwrap()),
    ])
    .unwrap();
    let refused = Limiter::new(store, policy)
        .decide(&subject, &Request::new(Op::Record, 5))
        .await
        .unwrap_err();
    assert!(refused.is_invalid(), "{refused}");
    assert!(refused.to_string().contains("in_flight"), "{refused}");
}
