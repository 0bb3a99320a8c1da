//! Instructions per decision on the in-process paths, for
//! scripts/bench-house-callgrind.sh: each `probe_*` loop runs N decisions
//! and is counted alone (callgrind's --toggle-collect). Copied into the
//! examples of both trees compared, so it uses only API both have.
use std::hint::black_box;
use std::time::Duration;

use tollgate::{DirectLimiter, Limit, MemoryStore, Op, Policy, Request, Subject, Timestamp};

const N: u64 = 200_000;

#[inline(never)]
fn probe_direct_request(limiter: &DirectLimiter) -> u64 {
    let mut allowed = 0;
    for i in 0..N {
        let request = Request::new(Op::Check, 1).at(Timestamp::from_micros(1_700_000_000_000_000 + i * 7));
        allowed += u64::from(limiter.decide_now(black_box(&request)).unwrap().decision.allowed);
    }
    allowed
}

#[inline(never)]
fn probe_direct_check(limiter: &DirectLimiter) -> u64 {
    let mut allowed = 0;
    for i in 0..N {
        allowed += u64::from(limiter.check_at(1, Timestamp::from_micros(1_700_000_000_000_000 + i * 7)).unwrap().allowed);
    }
    allowed
}

#[inline(never)]
fn probe_store_request(store: &MemoryStore, policy: &Policy, subjects: &[Subject]) -> u64 {
    let mut allowed = 0;
    for i in 0..N {
        let subject = &subjects[(i % subjects.len() as u64) as usize];
        let request = Request::new(Op::Check, 1).at(Timestamp::from_micros(1_700_000_000_000_000 + i * 7));
        allowed += u64::from(store.decide_now(subject, policy, black_box(&request)).unwrap().decision.allowed);
    }
    allowed
}

#[inline(never)]
fn probe_store_check(store: &MemoryStore, policy: &Policy, subjects: &[Subject]) -> u64 {
    let mut allowed = 0;
    for i in 0..N {
        let subject = &subjects[(i % subjects.len() as u64) as usize];
        allowed += u64::from(store.check_at(subject, policy, 1, Timestamp::from_micros(1_700_000_000_000_000 + i * 7)).unwrap().allowed);
    }
    allowed
}

#[inline(never)]
fn probe_one(store: &MemoryStore, policy: &Policy) -> u64 {
    let subject = Subject::new("203.0.113.7");
    let mut allowed = 0;
    for i in 0..N {
        let request = Request::new(Op::Check, 1).at(Timestamp::from_micros(1_700_000_000_000_000 + i * 9_000));
        allowed += u64::from(store.decide_now(black_box(&subject), black_box(policy), black_box(&request)).unwrap().decision.allowed);
    }
    allowed
}

fn main() {
    let which = std::env::args().nth(1).unwrap_or_default();
    let limit = || Limit::gcra(100_000, Duration::from_secs(1), 1).unwrap();
    let limit_named = std::env::args().nth(2);
    let limit = || match limit_named.as_deref() {
        Some(json) => Limit::from_json(json).unwrap(),
        None => limit(),
    };
    let subjects: Vec<Subject> = (0..1000).map(|i| Subject::new(&format!("user-{i}"))).collect();
    let store = MemoryStore::new();
    let policy = Policy::single(limit());
    let direct = DirectLimiter::new(limit());
    let allowed = match which.as_str() {
        "direct_request" => probe_direct_request(&direct),
        "direct_check" => probe_direct_check(&direct),
        "store_request" => probe_store_request(&store, &policy, &subjects),
        "one" => probe_one(&store, &policy),
        "store_check" => probe_store_check(&store, &policy, &subjects),
        _ => panic!("which?"),
    };
    println!("{which}: {allowed}");
}
