//! Listing the subjects a store holds state for, a page at a time at a
//! bounded cost per page, whatever the store's size ([`SubjectPage`]).

use crate::error::{Error, Result};

/// A page of the subjects a store holds state for under one limit name
/// ([`MemoryStore::subjects`](crate::MemoryStore::subjects)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubjectPage {
    /// Each subject's parts, decoded ([`crate::subject_parts`]).
    pub subjects: Vec<Vec<String>>,
    /// Where the next page starts, when the listing is not over. A page
    /// may hold fewer subjects than asked for, even none, and still have a
    /// next: each page examines a bounded part of the store.
    pub cursor: Option<String>,
}

/// Where a listing stands: a position in the store (a shard, Redis's
/// `SCAN` cursor) and the fitting subjects of that position's step already
/// listed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Position {
    pub(crate) step: u64,
    pub(crate) skip: usize,
}

impl Position {
    /// Reads a cursor this store gave (`<step>.<skip>`); none: the start.
    pub(crate) fn parse(cursor: Option<&str>) -> Result<Self> {
        let Some(cursor) = cursor else {
            return Ok(Self::default());
        };
        cursor
            .split_once('.')
            .and_then(|(step, skip)| Some((step.parse().ok()?, skip.parse().ok()?)))
            .map(|(step, skip)| Self { step, skip })
            .ok_or_else(|| Error::invalid_argument(format!("cursor: \"{cursor}\" is not a listing cursor")))
    }

    pub(crate) fn cursor(self) -> String {
        format!("{}.{}", self.step, self.skip)
    }
}

/// Adds the fitting subjects of one step (in the order the step gave
/// them) to `page`, past the `skip` already listed, up to `limit`; where
/// the next page starts if this step was not taken whole.
pub(crate) fn take_step(
    page: &mut Vec<Vec<String>>,
    fitting: Vec<Vec<String>>,
    at: Position,
    limit: usize,
) -> Option<Position> {
    let wanted = limit.saturating_sub(page.len());
    let left = fitting.len().saturating_sub(at.skip);
    page.extend(fitting.into_iter().skip(at.skip).take(wanted));
    (left > wanted).then_some(Position {
        step: at.step,
        skip: at.skip + wanted,
    })
}
