use super::*;
use crate::algorithm::testing::{self, from_params, known, written_zset as written};

const T0: u64 = 1_700_000_000_000_000;

/// 10 per 1 000 µs.
fn limit() -> SlidingLog {
    from_params(&[10, 1_000]).unwrap()
}

/// What a load of `value` at `now` gives: a state or none.
fn read(value: &Value, now: u64) -> Option<Box<SlidingLogState>> {
    known(limit().load(value, now))
}

/// Runs `action` and commits it, as a store does.
fn run(state: &mut Option<Box<SlidingLogState>>, now: u64, action: Action<'_>, cost: u64) -> Decision {
    testing::run(&limit(), state, now, action, cost)
}

/// Decisions of every kind at `now`, and the units available.
fn probes(state: Option<&SlidingLogState>, now: u64) -> (Vec<Decision>, u64) {
    testing::window_probes(&limit(), state, now, (T0 + 300, 1))
}

#[test]
fn a_written_state_reads_back_deciding_the_same() {
    let mut state = None;
    let steps = [
        (T0, Action::Check, 2),
        (T0 + 300, Action::Check, 3),
        (T0 + 300, Action::Check, 1),
        (T0 + 700, Action::Check, 2),
        (
            T0 + 800,
            Action::Refund {
                at: T0 + 300,
                lease: None,
            },
            2,
        ),
        (T0 + 1_100, Action::Check, 4),
        (
            T0 + 1_200,
            Action::Refund {
                at: T0 + 700,
                lease: None,
            },
            2,
        ),
    ];
    for (at, action, cost) in steps {
        let decision = run(&mut state, at, action, cost);
        assert!(decision.allowed, "at {at}");
        let state = state.as_deref().unwrap();
        let expires = at + decision.reset_after.as_micros() as u64;
        let value = written(limit().encode(state, expires));
        for now in [at, at + 1, at + 299, at + 300, expires - 1] {
            let loaded = read(&value, now);
            assert_eq!(
                probes(loaded.as_deref(), now),
                probes(Some(state), now),
                "written at {at}, read at {now}"
            );
        }
        // Lapsed: nothing live, as none.
        let lapsed = read(&value, expires);
        assert_eq!(probes(lapsed.as_deref(), expires), probes(None, expires));
    }
}

#[test]
fn a_set_as_the_lua_leaves_it_reads_as_the_lua_reads_it() {
    let now = T0 + 600;
    // The entry at T0 - 500 left at T0 + 500: it stays, known to have
    // left, until an admission trims it; the base becomes its total.
    let value = Value::Zset(vec![
        (b"\0x".to_vec(), -(T0 + 1_300).cast_signed()),
        (b"\0b".to_vec(), 5),
        (text(T0 - 500), 7),
        (text(T0 + 100), 9),
        (text(T0 + 300), 12),
    ]);
    let loaded = read(&value, now).unwrap();
    assert_eq!(loaded.base, 5);
    assert_eq!(loaded.entries, [(T0 - 500, 7), (T0 + 100, 9), (T0 + 300, 12)]);
    assert_eq!(limit().available(Some(&loaded), now), 5);
    // An admission's write: the trimmed entry gone, the base its total.
    let mut state = Some(loaded);
    run(&mut state, now, Action::Check, 2);
    assert_eq!(
        limit().encode(state.as_deref().unwrap(), T0 + 1_600),
        Encoded::Zset(vec![
            (b"\0x".to_vec(), -(T0 + 1_600).cast_signed()),
            (b"\0b".to_vec(), 7),
            (text(T0 + 100), 9),
            (text(T0 + 300), 12),
            (text(T0 + 600), 14),
        ])
    );
    // "\0x" passed: the log lapsed, every entry dead whatever the
    // window; an admission trims them (a step at most), and "\0x" says
    // since when entries are dead.
    let Value::Zset(members) = &value else { unreachable!() };
    let mut lapsed = members.clone();
    lapsed[0].1 = -now.cast_signed();
    let mut state = read(&Value::Zset(lapsed), now);
    assert_eq!(state.as_ref().map(|state| state.dead_before), Some(T0 + 301));
    assert_eq!(limit().available(state.as_deref(), now), limit().limit);
    run(&mut state, now, Action::Check, 2);
    assert_eq!(
        limit().encode(state.as_deref().unwrap(), T0 + 1_600),
        Encoded::Zset(vec![
            ([&b"\0x"[..], &text(T0 + 301)].concat(), -(T0 + 1_600).cast_signed()),
            (b"\0b".to_vec(), 12),
            (text(T0 + 600), 14),
        ])
    );
    assert_eq!(read(&value, T0 + 1_300 - 1).map(|state| state.entries.len()), Some(3));
    // Every entry gone: nothing live.
    let gone = Value::Zset(members[..3].to_vec());
    assert_eq!(limit().available(read(&gone, now).as_deref(), now), limit().limit);
    // Another algorithm's value: none.
    let leases = Value::Zset(vec![(b"\0n".to_vec(), -1), (b"a".to_vec(), (T0 + 900).cast_signed())]);
    let window = Value::Hash(vec![(text(T0), b"1".to_vec()), (b"x".to_vec(), text(T0 + 900))]);
    for other in [
        leases,
        window,
        Value::String(b"f10:2".to_vec()),
        Value::Other,
        Value::Missing,
    ] {
        assert_eq!(read(&other, now), None);
    }
}

#[test]
fn params_come_back() {
    let limit = limit();
    let params: Vec<u64> = limit.params().into_iter().collect();
    assert_eq!(from_params(&params), Some(limit));
    assert_eq!(from_params::<SlidingLog>(&[10]), None);
    assert_eq!(from_params::<SlidingLog>(&[0, 1_000]), None);
}
