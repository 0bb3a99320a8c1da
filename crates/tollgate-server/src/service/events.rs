//! What happened to the service that an operator wants to see (the
//! console's events page, `GET /v1/events`): configurations applied and
//! refused (with the reason), overrides set, deleted and expired. The last
//! [`KEPT`] are kept in memory, each with an increasing id, so a reader
//! asks for those after the last it saw.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

use serde::Serialize;

use super::answer::unix_now;
use super::Service;

/// Events kept.
pub const KEPT: usize = 500;

/// One event.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Event {
    /// Increasing from 1 over the process's life.
    pub id: u64,
    /// When, in microseconds since the Unix epoch.
    pub at_us: u64,
    /// `config` (applied), `config_refused`, `override`, or `alert`.
    pub kind: &'static str,
    /// What happened, in words.
    pub text: String,
}

/// The last events.
#[derive(Debug, Default)]
pub(super) struct Events {
    kept: Mutex<Kept>,
}

#[derive(Debug, Default)]
struct Kept {
    /// The last id given.
    last_id: u64,
    /// The last [`KEPT`], oldest first.
    events: VecDeque<Event>,
    /// The last configuration refused (an xDS NACK, a file that failed to
    /// load), kept however many events came after it.
    last_refused: Option<Event>,
}

impl Events {
    pub(super) fn push(&self, kind: &'static str, text: String) {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.last_id += 1;
        let event = Event {
            id: kept.last_id,
            at_us: unix_now(),
            kind,
            text,
        };
        if kind == "config_refused" {
            kept.last_refused = Some(event.clone());
        }
        if kept.events.len() == KEPT {
            kept.events.pop_front();
        }
        kept.events.push_back(event);
    }

    fn last_refused(&self) -> Option<Event> {
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.last_refused.clone()
    }

    fn after(&self, id: u64) -> Vec<Event> {
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.events
            .iter()
            .rev()
            .take_while(|event| event.id > id)
            .cloned()
            .collect()
    }
}

impl Service {
    /// Records that a configuration from `source` was applied.
    pub fn config_applied(&self, source: &str) {
        self.events.push("config", format!("configuration applied: {source}"));
    }

    /// Records that a configuration was refused, and why.
    pub fn config_refused(&self, reason: &str) {
        self.events.push(
            "config_refused",
            format!("configuration refused, the previous one stays: {reason}"),
        );
    }

    /// The last configuration refused (an xDS NACK, a file that failed to
    /// load) since start, if any.
    pub fn last_refused_config(&self) -> Option<Event> {
        self.events.last_refused()
    }

    /// Records an override's change.
    pub(super) fn override_event(&self, text: String) {
        self.events.push("override", text);
    }

    /// The events after `id`, newest first.
    pub fn events_after(&self, id: u64) -> Vec<Event> {
        self.events.after(id)
    }
}
