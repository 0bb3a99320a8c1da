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
    kept: Mutex<(u64, VecDeque<Event>)>,
}

impl Events {
    pub(super) fn push(&self, kind: &'static str, text: String) {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.0 += 1;
        let event = Event {
            id: kept.0,
            at_us: unix_now(),
            kind,
            text,
        };
        if kept.1.len() == KEPT {
            kept.1.pop_front();
        }
        kept.1.push_back(event);
    }

    fn after(&self, id: u64) -> Vec<Event> {
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.1.iter().rev().take_while(|event| event.id > id).cloned().collect()
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

    /// Records an override's change.
    pub(super) fn override_event(&self, text: String) {
        self.events.push("override", text);
    }

    /// The events after `id`, newest first.
    pub fn events_after(&self, id: u64) -> Vec<Event> {
        self.events.after(id)
    }
}
