use super::*;
use crate::algorithm::testing::{self, from_params, known, written_zset as written};

const T0: u64 = 1_700_000_000_000_000;

/// 10 units at once, leases of 1 000 µs.
fn limit() -> Concurrency {
    from_params(&[10, 1_000]).unwrap()
}

/// What a load of `value` at `now` gives: a state or none.
fn read(value: &Value, now: u64) -> Option<Box<ConcurrencyState>> {
    known(limit().load(value, now))
}

/// An acquire of `lease`, waiting for nothing.
fn acquire(lease: &str) -> Action<'_> {
    Action::Acquire {
        lease: Some(lease),
        max_wait: None,
    }
}

/// Runs `action` and commits it, as a store does.
fn run(state: &mut Option<Box<ConcurrencyState>>, now: u64, action: Action<'_>, cost: u64) -> Decision {
    testing::run(&limit(), state, now, action, cost)
}

/// Decisions of every kind at `now`, and the units available.
fn probes(state: Option<&ConcurrencyState>, now: u64) -> (Vec<Decision>, u64) {
    let limit = limit();
    let mut decisions = Vec::new();
    for lease in ["a", "b", "c", "new"] {
        for cost in [1, 2, 5, 10, 11] {
            decisions.push(limit.decide(state, now, acquire(lease), cost).decision);
        }
        decisions.push(limit.decide(state, now, Action::Release(lease), 0).decision);
    }
    decisions.push(limit.decide(state, now, Action::Check, 0).decision);
    (decisions, limit.available(state, now))
}

/// The leases as `(name, ends, units)`, in order of ending, and the total.
fn leases(state: &ConcurrencyState) -> (Vec<(String, u64, u64)>, u64) {
    let leases = state
        .by_expiry
        .iter()
        .map(|(&(ends, _), (name, cost))| (name.to_string(), ends, *cost))
        .collect();
    (leases, state.held)
}

#[test]
fn a_written_state_reads_back_deciding_the_same() {
    let mut state = None;
    let steps = [
        (T0, acquire("a"), 3),
        (T0 + 100, acquire("b"), 1),
        (T0 + 100, acquire("c"), 2),
        (T0 + 200, acquire("a"), 1),
        (T0 + 300, Action::Release("b"), 0),
        (T0 + 1_150, acquire("b"), 4),
        (
            T0 + 1_200,
            Action::Refund {
                at: T0,
                lease: Some("b"),
            },
            4,
        ),
    ];
    for (at, action, cost) in steps {
        let decision = run(&mut state, at, action, cost);
        assert!(decision.allowed, "at {at}");
        let state = state.as_deref().unwrap();
        let value = written(limit().encode(state, 0));
        for now in [at, at + 1, at + 799, at + 800, at + 900, at + 1_000] {
            let loaded = read(&value, now);
            assert_eq!(
                probes(loaded.as_deref(), now),
                probes(Some(state), now),
                "written at {at}, read at {now}"
            );
        }
    }
}

#[test]
fn ties_decide_alike_whatever_their_order() {
    // Three leases ending at one instant, taken in the reverse of their
    // names' order: read back, they are in their names' order.
    let mut state = None;
    for (lease, cost) in [("c", 1), ("b", 4), ("a", 2)] {
        run(&mut state, T0, acquire(lease), cost);
    }
    let state = state.unwrap();
    let loaded = read(&written(limit().encode(&state, 0)), T0 + 10).unwrap();
    assert_eq!(
        leases(&loaded).0.iter().map(|l| l.0.as_str()).collect::<String>(),
        "abc"
    );
    assert_eq!(probes(Some(&loaded), T0 + 10), probes(Some(&state), T0 + 10));
}

#[test]
fn a_set_as_the_lua_leaves_it_reads_as_the_lua_reads_it() {
    let now = T0 + 600;
    // "a" ended at T0 + 500: the Lua trims it (and its unit) on load.
    let value = Value::Zset(vec![
        (b"\0n".to_vec(), -6),
        (b"\0cb".to_vec(), -3),
        (b"\0cc".to_vec(), -2),
        (b"a".to_vec(), (T0 + 500).cast_signed()),
        (b"b".to_vec(), (T0 + 900).cast_signed()),
        (b"c".to_vec(), (T0 + 1_200).cast_signed()),
    ]);
    let loaded = read(&value, now).unwrap();
    assert_eq!(
        leases(&loaded),
        (vec![("b".to_owned(), T0 + 900, 3), ("c".to_owned(), T0 + 1_200, 2)], 5)
    );
    assert_eq!(limit().available(Some(&loaded), now), 5);
    // Renewing "c" for one unit: its "\0c" member goes, the total is 4.
    let mut state = Some(loaded);
    run(&mut state, now, acquire("c"), 1);
    assert_eq!(
        written(limit().encode(state.as_deref().unwrap(), 0)),
        Value::Zset(vec![
            (b"\0n".to_vec(), -4),
            (b"\0cb".to_vec(), -3),
            (b"b".to_vec(), (T0 + 900).cast_signed()),
            (b"c".to_vec(), (T0 + 1_600).cast_signed()),
        ])
    );
    // Every lease ended: none.
    assert_eq!(read(&value, T0 + 1_200), None);
    // Another algorithm's value: none.
    let log = Value::Zset(vec![
        (b"\0x".to_vec(), -(T0 + 1_000).cast_signed()),
        (b"\0b".to_vec(), 0),
        (b"1".to_vec(), 1),
    ]);
    for other in [
        log,
        Value::String(b"f10:2".to_vec()),
        Value::Hash(Vec::new()),
        Value::Other,
    ] {
        assert_eq!(read(&other, now), None);
    }
}

#[test]
fn params_come_back() {
    let limit = limit();
    let params: Vec<u64> = limit.params().into_iter().collect();
    assert_eq!(from_params(&params), Some(limit));
    assert_eq!(from_params::<Concurrency>(&[10, 1_000, 1]), None);
    assert_eq!(from_params::<Concurrency>(&[10, 0]), None);
}
