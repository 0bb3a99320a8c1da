//! envoyproxy/ratelimit's counting, exactly: random requests of one to
//! three descriptors (with and without a per-descriptor `hits_addend`, both
//! settings of `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`) go through the
//! service and through a model of upstream's Redis written from its
//! documented behaviour; every status, every `limit_remaining` and, at the
//! end, the count each key holds must agree.
//!
//! The model (upstream's fixed cache, without its local over-limit cache):
//! a descriptor's hits are its own `hits_addend` when present (0 checks
//! only), else the request's, where 0 means 1. A descriptor is over when
//! count + hits > limit. With the setting true, when any descriptor is over
//! only those add their hits; when none is, all do. With it false, all add.
//! An over descriptor answers OVER_LIMIT with 0 remaining; the others OK
//! with limit − (count after).
#![recursion_limit = "256"]

mod common;

use std::time::Duration;

use proptest::prelude::*;
use tollgate::{AnyStore, Limit, ManualClock, MemoryStore, Op, Policy, Request, Store, Subject, Timestamp};
use tollgate_server::service::{CheckRequest, Code, Descriptor};
use tollgate_server::{Options, Service};

use common::{config, NOON};

const CONFIG: &str = r"
domain: budget
descriptors:
  - key: a
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: b
    rate_limit: {unit: day, requests_per_unit: 12}
  - key: c
    rate_limit: {unit: day, requests_per_unit: 30}
";

const KEYS: [(&str, u64); 3] = [("a", 5), ("b", 12), ("c", 30)];

#[derive(Debug, Clone)]
struct Ask {
    /// Which keys (distinct), each with its own `hits_addend` or none.
    descriptors: Vec<(usize, Option<u64>)>,
    /// The request's `hits_addend` (0: unset).
    hits: u64,
}

fn asks() -> impl Strategy<Value = Vec<Ask>> {
    let ask = (
        prop::sample::subsequence(vec![0usize, 1, 2], 1..=3).prop_shuffle(),
        prop::collection::vec(
            prop::option::weighted(0.6, prop_oneof![2 => Just(0u64), 5 => 1u64..20]),
            3,
        ),
        prop_oneof![Just(0u64), 1u64..10],
    )
        .prop_map(|(keys, own, hits)| Ask {
            descriptors: keys.into_iter().zip(own).collect(),
            hits,
        });
    prop::collection::vec(ask, 1..25)
}

/// Upstream's counts and answers.
struct Upstream {
    counts: [u64; 3],
    stop_increment_when_over: bool,
}

impl Upstream {
    fn answer(&mut self, ask: &Ask) -> Vec<(Code, u64)> {
        let hits: Vec<u64> = ask
            .descriptors
            .iter()
            .map(|&(_, own)| own.unwrap_or(ask.hits.max(1)))
            .collect();
        let over: Vec<bool> = ask
            .descriptors
            .iter()
            .zip(&hits)
            .map(|(&(key, _), &hits)| self.counts[key] + hits > KEYS[key].1)
            .collect();
        let any_over = over.iter().any(|&over| over);
        let mut answers = Vec::new();
        for ((&(key, _), &hits), &over) in ask.descriptors.iter().zip(&hits).zip(&over) {
            let adds = !self.stop_increment_when_over || !any_over || over;
            if adds {
                self.counts[key] += hits;
            }
            let limit = KEYS[key].1;
            answers.push(if self.counts[key] > limit {
                (Code::OverLimit, 0)
            } else {
                (Code::Ok, limit - self.counts[key])
            });
        }
        answers
    }
}

fn service(store: &MemoryStore, stop_increment_when_over: bool) -> Service {
    let config = config(CONFIG);
    let options = Options {
        stop_increment_when_over,
        ..Options::default()
    };
    Service::new(config, AnyStore::Memory(store.clone()), options)
}

fn request(ask: &Ask) -> CheckRequest {
    CheckRequest {
        domain: "budget".to_owned(),
        descriptors: ask
            .descriptors
            .iter()
            .map(|&(key, own)| {
                let mut descriptor = Descriptor::entries(vec![(KEYS[key].0.to_owned(), "tenant".to_owned())]);
                descriptor.cost = own;
                descriptor
            })
            .collect(),
        // As the gRPC front end reads it: 0 is not set.
        cost: (ask.hits > 0).then_some(ask.hits),
    }
}

/// The count a key holds, read through a limit of the same name that no
/// count can exceed (a redefined limit reads the state as it is).
async fn count(store: &MemoryStore, key: usize) -> u64 {
    const HUGE: u64 = 1 << 40;
    let subject = Subject::from_parts(["budget", KEYS[key].0, "tenant"]);
    let policy = Policy::new([("rule", Limit::fixed_window(HUGE, Duration::from_secs(86_400)).unwrap())]).unwrap();
    let peek = store
        .decide(&subject, &policy, &Request::new(Op::Check, 0))
        .await
        .unwrap();
    HUGE - peek.decision.remaining
}

fn agree(asks: &[Ask], stop_increment_when_over: bool) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = MemoryStore::with_clock(ManualClock::new(Timestamp::from_micros(NOON)));
        let service = service(&store, stop_increment_when_over);
        let mut upstream = Upstream {
            counts: [0; 3],
            stop_increment_when_over,
        };
        for (index, ask) in asks.iter().enumerate() {
            let expected = upstream.answer(ask);
            let response = service.should_rate_limit(&request(ask)).await.unwrap();
            let actual: Vec<(Code, u64)> = response
                .statuses
                .iter()
                .map(|status| (status.code, status.limit_remaining))
                .collect();
            prop_assert_eq!(&actual, &expected, "request {} of {:?}", index, asks);
            let overall = if expected.iter().any(|(code, _)| *code == Code::OverLimit) {
                Code::OverLimit
            } else {
                Code::Ok
            };
            prop_assert_eq!(response.overall, overall);
        }
        for (key, (name, _)) in KEYS.iter().enumerate() {
            prop_assert_eq!(count(&store, key).await, upstream.counts[key], "the count of {}", name);
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn counts_as_upstream_with_stop_increment(asks in asks()) {
        agree(&asks, true)?;
    }

    #[test]
    fn counts_as_upstream_with_every_descriptor_adding(asks in asks()) {
        agree(&asks, false)?;
    }
}

/// The issue's shape: a budget of 1 000 tokens, completions reporting 800
/// each (per-descriptor `hits_addend`, as Envoy's `apply_on_stream_done`
/// sends it), checks of 0 before each request. The third request is refused.
#[test]
fn reported_usage_exhausts_a_token_budget() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let config = config(
            "domain: llm\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n",
        );
        let store = MemoryStore::with_clock(ManualClock::new(Timestamp::from_micros(NOON)));
        let service = Service::new(config, AnyStore::Memory(store), Options::default());
        let ask = |hits: u64| {
            let mut descriptor = Descriptor::entries(vec![("tenant".to_owned(), "acme".to_owned())]);
            descriptor.cost = Some(hits);
            CheckRequest {
                domain: "llm".to_owned(),
                descriptors: vec![descriptor],
                cost: None,
            }
        };
        let mut answers = Vec::new();
        for _ in 0..3 {
            let check = service.should_rate_limit(&ask(0)).await.unwrap();
            answers.push((check.overall, check.statuses[0].limit_remaining));
            if check.overall == Code::Ok {
                service.should_rate_limit(&ask(800)).await.unwrap();
            }
        }
        assert_eq!(
            answers,
            [(Code::Ok, 1000), (Code::Ok, 200), (Code::OverLimit, 0)],
            "800 reported on 200 remaining is counted: the tenant is then over"
        );
    });
}
