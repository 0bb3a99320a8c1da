//! The one error type of the crate.
//!
//! A denial is not an error: it is a [`Decision`](crate::Decision) with
//! `allowed == false`. [`Error`] is for limits and arguments that are invalid
//! and for stores that fail.

use std::fmt;

/// What went wrong, in broad strokes; see [`Error::kind`].
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A limit or policy failed validation (a zero rate, a missing unit, ...).
    InvalidLimit,
    /// A request was malformed: an operation the limit does not support, a
    /// bad subject, a cost out of range.
    InvalidArgument,
    /// The store could not be reached or answered with an error.
    Store,
    /// The store did not answer within the call's timeout.
    Timeout,
    /// What a durable limit counted was counted, but not made durable
    /// (replicated, fsynced) within the call's timeout.
    NotDurable,
}

/// An error from building a limit or running a decision.
///
/// Messages are lowercase, without a trailing period, and name the field at
/// fault where there is one (`burst must be at least 1`).
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    pub(crate) fn invalid_limit(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidLimit, message)
    }

    pub(crate) fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    /// Wraps a lower-level cause (kept as [`std::error::Error::source`]).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// What kind of error this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The limit or the request was invalid: retrying the same call fails again.
    pub fn is_invalid(&self) -> bool {
        matches!(self.kind, ErrorKind::InvalidLimit | ErrorKind::InvalidArgument)
    }

    /// The store did not answer in time.
    pub fn is_timeout(&self) -> bool {
        self.kind == ErrorKind::Timeout
    }

    /// The same call may succeed later (store faults and timeouts).
    pub fn is_transient(&self) -> bool {
        matches!(self.kind, ErrorKind::Store | ErrorKind::Timeout)
    }

    /// Prefixes the message with the place it came from (`per_second.burst: ...`).
    pub(crate) fn context(mut self, place: &str) -> Self {
        self.message = format!("{place}: {}", self.message);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|source| source as &(dyn std::error::Error + 'static))
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
