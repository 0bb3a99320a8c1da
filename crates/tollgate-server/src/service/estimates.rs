//! Take an estimate, then settle the actual: for a request whose cost is
//! known only when it is done (an LLM completion's tokens).
//!
//! `estimate` decides the request with its estimate as every descriptor's
//! cost, as a check does (so N concurrent requests cannot all pass while the
//! budget has room for one) but all-or-nothing even on rules that count as
//! envoyproxy/ratelimit (a refused estimate was never spent), and, when
//! admitted, keeps it under a
//! random id until its time to live ends. `settle(id, actual)` then gives
//! back the unused part ([`Op::Refund`](tollgate::Op::Refund) of the units
//! taken at the estimate's instant) or records the excess
//! ([`Op::Record`](tollgate::Op::Record): counted whether or not it fits),
//! one store call either way (at the estimate exactly, a look).
//!
//! Settling is idempotent: the same id settled again with the same amount
//! gets the first answer, with another amount a conflict. An unknown or
//! expired id is not found; an estimate nobody settles before its time to
//! live ends is settled at its estimate (it is forgotten: the estimate
//! stays counted). Open estimates are bounded ([`MAX_OPEN`]); expired
//! ones are swept as new ones come.
//!
//! The bound on overspend: at most the excess of the actual costs over their
//! estimates (check-then-report, without an estimate: the usage of every
//! request in flight).
//!
//! Estimates are kept by the process that took them (the limits
//! themselves are in the store): behind several `serve` replicas, a
//! settlement must reach the replica that answered the estimate, or its
//! id is not found.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

// Tokio's clock, which a test may pause and advance.
use tokio::time::Instant;

use super::{Charge, CheckRequest, CheckResponse, Code, Failure, Service, ServiceError};

/// The most estimates open at once; more is refused (503).
pub const MAX_OPEN: usize = 100_000;

/// How long an estimate waits for its settlement by default.
pub const DEFAULT_TTL: Duration = Duration::from_secs(600);

/// The longest an estimate may wait.
pub const MAX_TTL: Duration = Duration::from_secs(86_400);

/// The open estimates of a service.
#[derive(Debug, Default)]
pub struct Estimates {
    open: Mutex<HashMap<String, Arc<Estimate>>>,
}

#[derive(Debug)]
struct Estimate {
    /// The request, with the estimate as its cost.
    request: CheckRequest,
    /// The store's instant when the estimate was taken (µs).
    taken_at: u64,
    expires: Instant,
    /// The settlement once made: the actual, and the answer.
    settled: tokio::sync::Mutex<Option<(u64, CheckResponse)>>,
}

/// What an estimate was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Estimated {
    /// The decision on the estimate, as a check answers it.
    pub response: CheckResponse,
    /// The estimate's id, when it was admitted.
    pub id: Option<String>,
    /// How long it waits for its settlement.
    pub ttl: Duration,
}

impl Estimates {
    /// Keeps `estimate` under a new id; `None` when too many are open.
    fn open(&self, estimate: Estimate) -> Option<String> {
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if open.len() >= MAX_OPEN / 2 {
            let now = Instant::now();
            open.retain(|_, estimate| estimate.expires > now);
        }
        if open.len() >= MAX_OPEN {
            return None;
        }
        let id = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
        open.insert(id.clone(), Arc::new(estimate));
        Some(id)
    }

    /// The open estimate `id`, unless it has expired (then it goes).
    fn get(&self, id: &str) -> Option<Arc<Estimate>> {
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let estimate = open.get(id)?;
        if estimate.expires <= Instant::now() {
            open.remove(id);
            return None;
        }
        Some(Arc::clone(estimate))
    }

    /// How many are open (expired ones not yet swept included).
    pub fn len(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// True when none is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Service {
    /// Decides `request` (its `cost` the estimate; no per-descriptor cost)
    /// as a check, and when admitted keeps it open for `ttl` (default
    /// [`DEFAULT_TTL`]) under the id it answers.
    ///
    /// # Errors
    ///
    /// As [`Service::should_rate_limit`]; per-descriptor costs, a `ttl` of
    /// zero or above [`MAX_TTL`] are invalid; too many open estimates is
    /// unavailable.
    pub async fn estimate(&self, request: &CheckRequest, ttl: Option<Duration>) -> Result<Estimated, ServiceError> {
        let ttl = ttl.unwrap_or(DEFAULT_TTL);
        if ttl.is_zero() || ttl > MAX_TTL {
            return Err(ServiceError::invalid(format!(
                "ttl must be more than zero and at most {} s",
                MAX_TTL.as_secs()
            )));
        }
        if let Some(index) = request
            .descriptors
            .iter()
            .position(|descriptor| descriptor.cost.is_some())
        {
            return Err(ServiceError::invalid(format!(
                "descriptors[{index}].cost: an estimate takes one estimate for the request (its cost)"
            )));
        }
        let response = self.decide_request(request, Charge::Estimate).await?;
        let id = match (response.overall, response.decided_at) {
            (Code::Ok, Some(taken_at)) => {
                let estimate = Estimate {
                    request: request.clone(),
                    taken_at,
                    expires: Instant::now() + ttl,
                    settled: tokio::sync::Mutex::new(None),
                };
                let id = self.estimates.open(estimate).ok_or_else(|| {
                    ServiceError::Refused(
                        Failure::Unavailable,
                        format!("{MAX_OPEN} estimates are open: settle some first"),
                    )
                })?;
                Some(id)
            }
            _ => None,
        };
        Ok(Estimated { response, id, ttl })
    }

    /// Settles estimate `id` with the `actual` cost: the unused part of
    /// the estimate goes back, an excess is recorded; answers the limits as
    /// they stand after (at the estimate exactly, nothing changes: a look).
    ///
    /// # Errors
    ///
    /// Not found for an unknown or expired id; a conflict when it was
    /// settled with another amount; a store fault (then it may be settled
    /// again).
    pub async fn settle(&self, id: &str, actual: u64) -> Result<CheckResponse, ServiceError> {
        let open = self.estimates.get(id).ok_or_else(|| {
            ServiceError::Refused(
                Failure::NotFound,
                format!("estimate \"{id}\" is unknown or has expired (an expired one is settled at its estimate)"),
            )
        })?;
        let mut settled = open.settled.lock().await;
        if let Some((settled_with, response)) = &*settled {
            return if *settled_with == actual {
                Ok(response.clone())
            } else {
                Err(ServiceError::Refused(
                    Failure::Conflict,
                    format!("estimate \"{id}\" was settled with {settled_with}, not {actual}"),
                ))
            };
        }
        let estimate = open.request.default_cost();
        let response = if actual == estimate {
            self.should_rate_limit(&CheckRequest {
                cost: Some(0),
                ..open.request.clone()
            })
            .await?
        } else {
            let taken_at = tollgate::Timestamp::from_micros(open.taken_at);
            let settlement = tollgate::Request::settlement(taken_at, estimate, actual);
            let request = CheckRequest {
                cost: Some(settlement.units()),
                ..open.request.clone()
            };
            self.adjust(&request, &settlement.op).await?
        };
        *settled = Some((actual, response.clone()));
        Ok(response)
    }
}
