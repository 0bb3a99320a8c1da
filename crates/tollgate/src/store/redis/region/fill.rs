//! Filling a region's share from home: a block taken there (or, cut off
//! with `local`, a fraction of the limit without it), added to the share if
//! this replica still holds its lock, and what cannot be added or was
//! replaced given back.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{micros, share, Region};
use crate::clock::Timestamp;
use crate::error::{Error, ErrorKind, Result};
use crate::policy::Policy;
use crate::request::{Op, Request};
use crate::store::{OnStoreError, Store};
use crate::subject::Subject;
use crate::Limit;

impl<S: Store> Region<S> {
    /// Fills `key`'s share with a block of `block` units from home (this
    /// replica holds its lock); gives back what it cannot add.
    pub(super) async fn fill(
        this: Arc<Self>,
        subject: Subject,
        policy: Policy,
        key: String,
        block: u64,
        now: Option<Timestamp>,
    ) {
        let started = Instant::now();
        let mut request = Request::new(Op::CheckAtMost, block);
        request.now = now;
        // While home cannot be reached, a fill does not wait on it (each
        // call would take the whole timeout, the share's lock held): one
        // probe at a time finds when it answers again.
        let answer = if this.stats.home_unreachable.load(Ordering::Relaxed) {
            Self::probe(&this);
            Err(Error::new(ErrorKind::Store, "home cannot be reached"))
        } else {
            this.home.decide(&subject, &policy, &request).await
        };
        let elapsed = started.elapsed();
        let stats = &this.stats;
        let Some((_, limit)) = policy.limits().next() else {
            return;
        };
        let now_arg = now.map(|now| now.as_micros().to_string()).unwrap_or_default();
        let Ok(outcome) = answer else {
            stats.fill_failures.fetch_add(1, Ordering::Relaxed);
            stats.home_unreachable.store(true, Ordering::Relaxed);
            if this.on_home_error == OnStoreError::Local && this.fraction > 0.0 {
                this.fill_without_home(&key, limit, &now_arg).await;
            } else {
                let mut invocation = share::release().key(&key);
                invocation
                    .arg(&now_arg)
                    .arg(&this.replica)
                    .arg(micros(this.block / 10).max(micros(Duration::from_millis(100))));
                let _ = this
                    .regional
                    .bounded(this.regional.inner.client.connection.invoke::<u8>(&invocation))
                    .await;
            }
            return;
        };
        stats.fills.fetch_add(1, Ordering::Relaxed);
        stats.last_fill.store(micros(elapsed), Ordering::Relaxed);
        if let Some((name, _)) = policy.limits().next() {
            this.note(name, |rule| {
                rule.fills += 1;
                rule.units_taken += outcome.granted;
                rule.last_fill = elapsed;
            });
        }
        let previous = stats.round_trip.load(Ordering::Relaxed);
        let smoothed = if previous == 0 {
            micros(elapsed)
        } else {
            (3 * previous + micros(elapsed)) / 4
        };
        stats.round_trip.store(smoothed, Ordering::Relaxed);
        stats.home_unreachable.store(false, Ordering::Relaxed);
        // On the caller's clock the block's life starts when home
        // counted it; on the server's, it is shortened by the
        // time the answer took to come back.
        let spent = if now.is_some() { Duration::ZERO } else { elapsed };
        let mut life = this.block;
        if limit.window().is_some() {
            life = life.min(outcome.decision.reset_after);
        }
        let life = life.saturating_sub(spent);
        let retry = if outcome.granted < block {
            outcome
                .decision
                .retry_after
                .unwrap_or(outcome.decision.reset_after)
                .saturating_sub(spent)
                .max(Duration::from_millis(1))
        } else {
            Duration::ZERO
        };
        let at = outcome.decided_at;
        let mut invocation = share::add().key(&key);
        invocation
            .arg(&now_arg)
            .arg(&this.replica)
            .arg(outcome.granted)
            .arg(micros(life))
            .arg(at.as_micros())
            .arg(micros(retry))
            .arg(micros(life) / 4)
            .arg(0);
        let added: Result<(u8, u64, u64)> = this
            .regional
            .bounded(this.regional.inner.client.connection.invoke(&invocation))
            .await;
        match added {
            Ok((1, back, back_at)) => {
                if back > 0 {
                    this.give_back(&subject, &policy, back, Timestamp::from_micros(back_at), now)
                        .await;
                }
            }
            // The lock lapsed and another replica took it, or the
            // regional Redis failed: the block goes back home.
            _ => this.give_back(&subject, &policy, outcome.granted, at, now).await,
        }
    }

    /// Asks home whether it answers again (one probe at a time).
    fn probe(this: &Arc<Self>) {
        if this.stats.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let region = Arc::clone(this);
        tokio::spawn(async move {
            if region.home.ping().await.is_ok() {
                region.stats.home_unreachable.store(false, Ordering::Relaxed);
            }
            region.stats.probing.store(false, Ordering::Release);
        });
    }

    /// Home cannot be reached: fills the share with `fraction` of the
    /// limit, once per window (or block).
    async fn fill_without_home(&self, key: &str, limit: &Limit, now_arg: &str) {
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let units = (limit.capacity() as f64 * self.fraction).ceil() as u64;
        let period = limit.window().unwrap_or(self.block);
        let mut invocation = share::add().key(key);
        invocation
            .arg(now_arg)
            .arg(&self.replica)
            .arg(units)
            .arg(micros(period))
            .arg(0)
            .arg(0)
            .arg(0)
            .arg(micros(period));
        let _ = self
            .regional
            .bounded(
                self.regional
                    .inner
                    .client
                    .connection
                    .invoke::<(u8, u64, u64)>(&invocation),
            )
            .await;
    }

    /// Gives `units` counted at home at `at` back home (best effort: units
    /// not given back lapse, which under-admits, never over).
    async fn give_back(&self, subject: &Subject, policy: &Policy, units: u64, at: Timestamp, now: Option<Timestamp>) {
        let mut request = Request::new(Op::Refund { at, lease: None }, units);
        request.now = now;
        if self.home.decide(subject, policy, &request).await.is_ok() {
            self.stats.given_back.fetch_add(units, Ordering::Relaxed);
        }
    }
}
