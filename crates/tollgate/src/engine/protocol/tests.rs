//! The calling convention written and read back.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

/// The Lua library's source, where it names the convention's numbers.
const LUA: &str = concat!(
    include_str!("../../store/redis/prelude.lua"),
    include_str!("../../store/redis/tollgate.lua"),
);

/// The Lua library's name for `op`.
fn lua_name(op: OpCode) -> &'static str {
    match op {
        OpCode::Check => "CHECK",
        OpCode::CheckAtMost => "CHECK_AT_MOST",
        OpCode::Reserve => "RESERVE",
        OpCode::Acquire => "ACQUIRE",
        OpCode::Release => "RELEASE",
        OpCode::Reset => "RESET",
        OpCode::Refund => "REFUND",
        OpCode::Record => "RECORD",
    }
}

/// The integer constants a Lua source defines at its top level
/// (`local A, B = 1, 2`).
fn lua_constants(source: &str) -> HashMap<&str, i64> {
    let mut constants = HashMap::new();
    for line in source.lines() {
        let Some((names, values)) = line.strip_prefix("local ").and_then(|line| line.split_once(" = ")) else {
            continue;
        };
        let values = values.split("--").next().unwrap_or_default();
        for (name, value) in names.split(',').zip(values.split(',')) {
            if let Ok(value) = value.trim().parse() {
                let before = constants.insert(name.trim(), value);
                assert_eq!(before, None, "{name} is defined twice");
            }
        }
    }
    constants
}

#[test]
fn the_lua_library_names_the_same_numbers() {
    let lua = lua_constants(LUA);
    let constant = |name: &str| {
        lua.get(name)
            .copied()
            .unwrap_or_else(|| panic!("no {name} in the Lua library"))
    };
    for op in OpCode::ALL {
        assert_eq!(constant(lua_name(op)), i64::try_from(op.code()).unwrap(), "{op:?}");
        assert_eq!(OpCode::from_code(op.code()), Some(op));
    }
    assert_eq!(constant("RECORDS_OVERAGE"), i64::try_from(RECORDS_OVERAGE).unwrap());
    assert_eq!(constant("REPLY_HEAD"), i64::try_from(REPLY_HEAD).unwrap());
    assert_eq!(constant("REPLY_PER_LIMIT"), i64::try_from(REPLY_PER_LIMIT).unwrap());
}

#[test]
fn the_lua_library_reads_a_lease_and_a_refund_instant_after_the_same_ops() {
    let ops = |carries: fn(OpCode) -> bool| {
        let names: Vec<String> = OpCode::ALL
            .into_iter()
            .filter(|&op| carries(op))
            .map(|op| format!("op == {}", lua_name(op)))
            .collect();
        format!("if {} then", names.join(" or "))
    };
    let lease = ops(OpCode::carries_lease);
    assert!(
        LUA.contains(&format!("\n    {lease}\n      lease = args[at]\n")),
        "{lease}"
    );
    let refund = ops(OpCode::carries_refund_instant);
    assert!(
        LUA.contains(&format!(
            "\n      {refund}\n        -- The instant the units were taken"
        )),
        "{refund}"
    );
}

#[test]
fn a_head_is_written_as_the_library_reads_it() {
    let op = Op::Acquire {
        lease: "job-7".to_owned(),
        max_wait: Some(Duration::from_millis(5)),
    };
    let mut args: Vec<String> = Vec::new();
    Head::new(&op, 2, 3, None).encode(&mut args);
    Head::reset(1, Some(42)).encode(&mut args);
    let refund = Op::Refund {
        at: Timestamp::from_micros(9),
        lease: None,
    };
    Head::new(&refund, 1, 1, Some(10)).encode(&mut args);
    assert_eq!(args, ["4:2:3:5000:", "job-7", "6:0:1:-1:42", "7:1:1:-1:10", "", "9"]);
}

fn op_code() -> impl Strategy<Value = OpCode> {
    proptest::sample::select(OpCode::ALL.to_vec())
}

/// A head as a client may send it, and the lease it names.
fn head() -> impl Strategy<Value = (OpCode, u64, usize, Option<u64>, Option<u64>, Option<String>, u64)> {
    (
        op_code(),
        0..=MAX_NUMBER,
        0..=MAX_NUMBER as usize,
        proptest::option::of(0..=MAX_NUMBER),
        proptest::option::of(0..=MAX_NUMBER),
        proptest::option::of(".+"),
        0..=MAX_NUMBER,
    )
        .prop_map(|(op, cost, limits, max_wait, now, lease, refund_at)| {
            let lease = lease.filter(|_| op.carries_lease());
            let refund_at = if op.carries_refund_instant() { refund_at } else { 0 };
            (op, cost, limits, max_wait, now, lease, refund_at)
        })
}

proptest! {
    #[test]
    fn any_head_parses_back_as_it_was_encoded(
        (op, cost, limits, max_wait, now, lease, refund_at) in head(),
        limit in "[0-9:]{0,20}",
        limit_cost in 0..=MAX_NUMBER,
    ) {
        let outbox = limit_cost % 2 == 0;
        let head = Head { op, cost, limits, max_wait, now, lease: lease.as_deref(), refund_at, outbox };
        let mut args = Vec::new();
        head.encode(&mut args);
        args.push(format!("{limit}:{limit_cost}"));
        let bytes: Vec<&[u8]> = args.iter().map(String::as_bytes).collect();
        let mut rest = bytes.as_slice();
        prop_assert_eq!(Head::parse(&mut rest)?, head);
        prop_assert_eq!(rest.len(), 1);
        prop_assert_eq!(split_limit_argument(rest[0])?, (limit.as_bytes(), limit_cost));
    }

    #[test]
    fn any_limit_reply_reads_back_as_it_was_pushed(
        allowed: bool,
        limit in 0..=MAX_NUMBER,
        remaining in 0..=MAX_NUMBER,
        retry_after in proptest::option::of(0..=MAX_NUMBER),
        reset_after in 0..=MAX_NUMBER,
        wait in 0..=MAX_NUMBER,
    ) {
        let decision = Decision {
            allowed,
            limit,
            remaining,
            retry_after: retry_after.map(Duration::from_micros),
            reset_after: Duration::from_micros(reset_after),
            wait: Duration::from_micros(wait),
        };
        let crossed = i64::from(reset_after % 256 == 0) * 5;
        let mut reply = Vec::new();
        push_limit(&mut reply, &decision, crossed);
        prop_assert_eq!(reply.len(), REPLY_PER_LIMIT);
        prop_assert_eq!(read_limit(&reply), Some((decision, crossed)));
    }
}

/// Every algorithm's argument (recording its overage or not) reads back
/// as a limit whose argument is the same: the text is written and read
/// here only.
#[test]
fn a_limit_argument_reads_back_as_the_same_limit() {
    let second = Duration::from_secs(1);
    let limits = [
        Limit::fixed_window(10, second),
        Limit::sliding_window(10, second, 10),
        Limit::sliding_log(10, second),
        Limit::token_bucket(10, 1, second),
        Limit::reservation(10, second, 5),
        Limit::leaky_bucket(7, second, 5),
        Limit::gcra(7, second, 5),
        Limit::concurrency(10, second),
    ];
    for limit in limits {
        let limit = limit.expect("a valid limit");
        let recording = limit.clone().recording_overage().ok();
        for limit in std::iter::once(limit).chain(recording) {
            let argument = limit_argument(&limit, 3, || 0);
            let (text, cost) = split_limit_argument(argument.as_bytes()).expect("an argument");
            assert_eq!(cost, 3);
            let read = read_limit_text(text).expect("a limit");
            assert_eq!(limit_argument(&read, 3, || 0), argument, "{limit}");
            assert_eq!(read.records_overage(), limit.records_overage(), "{limit}");
        }
    }
    assert_eq!(
        read_limit_text(b"99:1:2").unwrap_err(),
        CallError::UnknownLimit { id: 99, params: 2 }
    );
}
