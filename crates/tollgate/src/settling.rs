//! Settlements of one subject sent to a shared store as one refund.
//!
//! While a refund of a subject is under way, the refunds that arrive for
//! it wait, and go together once it is answered: one refund of their
//! summed cost, which the algorithms say does what the refunds one after
//! the other would ([`Limit::refund_key`](crate::Limit)): a busy budget
//! costs one store call per round trip, not one per settlement. Each
//! settlement is answered with the limits as they stand after the refund
//! it went in.

use std::sync::Arc;

use hashbrown::HashMap;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::clock::Timestamp;
use crate::decision::Decision;
use crate::error::{Error, ErrorKind, Result};
use crate::subject::Subject;

/// The refunds waiting, by subject and refund keys (one per limit).
#[derive(Default)]
pub(crate) struct Settling {
    /// A queue exists while a refund of its key is under way.
    queues: Mutex<HashMap<Key, Option<Batch>, foldhash::fast::RandomState>>,
}

impl std::fmt::Debug for Settling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settling")
            .field("under_way", &self.queues.lock().len())
            .finish()
    }
}

type Key = (Subject, Vec<u64>);

/// Refunds sent as one: the first one's instant, the summed cost, and the
/// settlements waiting for its answer.
struct Batch {
    at: Timestamp,
    cost: u64,
    waiters: Vec<oneshot::Sender<Turn>>,
}

/// What a waiting settlement is told.
enum Turn {
    /// Its refund went in a batch: the answer.
    Done(Result<Decision>),
    /// Its batch is next: it sends it.
    Lead(Batch),
}

impl Settling {
    /// Gives back `cost` units of `subject`'s limits taken at `at` through
    /// `refund` (one store call, with an instant and a cost), as part of a
    /// batch when a refund of the same key is under way.
    pub(crate) async fn refund<F, Fut>(
        self: &Arc<Self>,
        key: Key,
        at: Timestamp,
        cost: u64,
        refund: F,
    ) -> Result<Decision>
    where
        F: FnOnce(Timestamp, u64) -> Fut,
        Fut: std::future::Future<Output = Result<Decision>>,
    {
        let turn = {
            let mut queues = self.queues.lock();
            if let Some(next) = queues.get_mut(&key) {
                let (sender, turn) = oneshot::channel();
                let batch = next.get_or_insert_with(|| Batch {
                    at,
                    cost: 0,
                    waiters: Vec::new(),
                });
                batch.cost = batch.cost.saturating_add(cost);
                batch.waiters.push(sender);
                Some(turn)
            } else {
                queues.insert(key.clone(), None);
                None
            }
        };
        let batch = match turn {
            None => Batch {
                at,
                cost,
                waiters: Vec::new(),
            },
            Some(turn) => match turn.await {
                Ok(Turn::Done(result)) => return result,
                Ok(Turn::Lead(batch)) => batch,
                // A leader hands on before it goes.
                Err(_) => return Err(Error::new(ErrorKind::Store, "the settlement's refund was dropped")),
            },
        };
        let mut leading = Leading {
            settling: self,
            key: Some(key),
            waiters: batch.waiters,
        };
        let result = refund(batch.at, batch.cost).await;
        for waiter in std::mem::take(&mut leading.waiters) {
            let _ = waiter.send(Turn::Done(copy(&result)));
        }
        result
    }
}

/// A batch being sent: when it ends (answered or dropped), the next batch
/// of its key goes to its first settlement still waiting.
struct Leading<'a> {
    settling: &'a Settling,
    key: Option<Key>,
    /// Waiting for this batch's answer (none left once answered).
    waiters: Vec<oneshot::Sender<Turn>>,
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        // Dropped before the answer: whether the refund was made is unknown.
        for waiter in self.waiters.drain(..) {
            let _ = waiter.send(Turn::Done(Err(Error::new(
                ErrorKind::Store,
                "the settlement's refund was cancelled before its answer",
            ))));
        }
        let Some(key) = self.key.take() else { return };
        let mut queues = self.settling.queues.lock();
        let Some(next) = queues.get_mut(&key).and_then(Option::take) else {
            queues.remove(&key);
            return;
        };
        let Batch { at, cost, mut waiters } = next;
        // The first settlement still waiting sends the batch; if none is
        // (all were dropped), neither is the batch, and their units stay
        // taken, as an unsettled estimate's do.
        while !waiters.is_empty() {
            let first = waiters.remove(0);
            let batch = Batch { at, cost, waiters };
            match first.send(Turn::Lead(batch)) {
                Ok(()) => return,
                Err(Turn::Lead(batch)) => waiters = batch.waiters,
                Err(Turn::Done(_)) => break,
            }
        }
        queues.remove(&key);
    }
}

fn copy(result: &Result<Decision>) -> Result<Decision> {
    match result {
        Ok(decision) => Ok(decision.clone()),
        Err(error) => Err(Error::new(error.kind(), error.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::future::Future;
    use std::pin::Pin;
    use std::rc::Rc;
    use std::task::{Context, Poll, Waker};

    use super::*;

    /// Refunds sent to a make-believe store: each call is recorded, and
    /// answered when the test opens its gate.
    #[derive(Default)]
    struct Calls {
        sent: RefCell<Vec<(u64, u64)>>,
        gates: RefCell<Vec<oneshot::Sender<()>>>,
    }

    impl Calls {
        fn refund(self: &Rc<Self>) -> impl FnOnce(Timestamp, u64) -> Pin<Box<dyn Future<Output = Result<Decision>>>> {
            let calls = Rc::clone(self);
            move |at, cost| {
                calls.sent.borrow_mut().push((at.as_micros(), cost));
                let (gate, opened) = oneshot::channel();
                calls.gates.borrow_mut().push(gate);
                Box::pin(async move {
                    opened
                        .await
                        .map(|()| Decision::unlimited())
                        .map_err(|_| Error::new(ErrorKind::Store, "the store went away"))
                })
            }
        }

        /// Answers the oldest call not yet answered.
        fn answer(&self) {
            let gate = self.gates.borrow_mut().remove(0);
            gate.send(()).unwrap();
        }
    }

    type Settle<'a> = Pin<Box<dyn Future<Output = Result<Decision>> + 'a>>;

    fn settle<'a>(settling: &'a Arc<Settling>, calls: &Rc<Calls>, subject: &str, at: u64, cost: u64) -> Settle<'a> {
        let key = (Subject::new(subject), vec![0]);
        Box::pin(settling.refund(key, Timestamp::from_micros(at), cost, calls.refund()))
    }

    fn step(settle: &mut Settle<'_>) -> Poll<Result<Decision>> {
        settle.as_mut().poll(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn refunds_of_a_subject_under_way_go_next_as_one() {
        let (settling, calls) = (Arc::new(Settling::default()), Rc::new(Calls::default()));
        let mut first = settle(&settling, &calls, "tenant", 10, 5);
        assert!(step(&mut first).is_pending());
        let mut second = settle(&settling, &calls, "tenant", 20, 3);
        let mut third = settle(&settling, &calls, "tenant", 30, 4);
        let mut other = settle(&settling, &calls, "another tenant", 40, 9);
        for settle in [&mut second, &mut third, &mut other] {
            assert!(step(settle).is_pending());
        }
        // Another subject's refund goes at once; this one's wait.
        assert_eq!(*calls.sent.borrow(), [(10, 5), (40, 9)]);

        calls.answer();
        assert!(matches!(step(&mut first), Poll::Ready(Ok(_))));
        // The first of those waiting sends them all: at its instant, their cost summed.
        assert!(step(&mut second).is_pending());
        assert!(step(&mut third).is_pending());
        assert_eq!(*calls.sent.borrow(), [(10, 5), (40, 9), (20, 7)]);

        calls.answer();
        calls.answer();
        assert!(matches!(step(&mut other), Poll::Ready(Ok(_))));
        assert!(matches!(step(&mut second), Poll::Ready(Ok(_))));
        assert!(matches!(step(&mut third), Poll::Ready(Ok(_))));
        assert_eq!(calls.sent.borrow().len(), 3);
        assert!(settling.queues.lock().is_empty(), "nothing is left under way");
    }

    #[test]
    fn a_settlement_dropped_while_its_refund_is_under_way_hands_the_next_on() {
        let (settling, calls) = (Arc::new(Settling::default()), Rc::new(Calls::default()));
        let mut first = settle(&settling, &calls, "tenant", 10, 5);
        assert!(step(&mut first).is_pending());
        let mut second = settle(&settling, &calls, "tenant", 20, 3);
        let mut third = settle(&settling, &calls, "tenant", 30, 4);
        assert!(step(&mut second).is_pending());
        assert!(step(&mut third).is_pending());

        // The first is cancelled before its answer: the next batch still goes.
        drop(first);
        assert!(step(&mut second).is_pending());
        assert_eq!(*calls.sent.borrow(), [(10, 5), (20, 7)]);

        // Its sender cancelled in turn: the one waiting on it learns that
        // whether its refund was made is unknown.
        drop(second);
        match step(&mut third) {
            Poll::Ready(Err(error)) => {
                assert_eq!(error.kind(), ErrorKind::Store);
                assert!(error.to_string().contains("cancelled"), "{error}");
            }
            other => panic!("expected the cancellation, got {other:?}"),
        }
        assert!(settling.queues.lock().is_empty(), "nothing is left under way");
        // And the subject settles again at once.
        let mut fourth = settle(&settling, &calls, "tenant", 40, 1);
        assert!(step(&mut fourth).is_pending());
        assert_eq!(calls.sent.borrow().last(), Some(&(40, 1)));
    }
}
