//! Why a request was not decided: a [`ServiceError`] of a [`Failure`] kind
//! (what each front end maps to its status code), with the library's error
//! kept whole as its source when the store or the library refused.

/// What kind of failure; each has its status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The request is malformed (400 / `INVALID_ARGUMENT`).
    InvalidArgument,
    /// The store failed or did not answer in time (503 / `UNAVAILABLE`, so
    /// Envoy's `failure_mode_deny` decides), or the service is full.
    Unavailable,
    /// What the request names is not there: an unknown or expired
    /// reservation (404 / `NOT_FOUND`).
    NotFound,
    /// The request contradicts what was done: a reservation settled
    /// already with another amount (409 / `FAILED_PRECONDITION`).
    Conflict,
}

/// Why a request was not decided.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The service's own refusal, of `Failure` kind.
    #[error("{1}")]
    Refused(Failure, String),
    /// The library's error: an invalid argument, or the store's fault.
    #[error(transparent)]
    Library(#[from] tollgate::Error),
}

impl ServiceError {
    /// A malformed request.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::Refused(Failure::InvalidArgument, message.into())
    }

    /// What kind of failure it is: a library error is an invalid argument
    /// when the library says so, else the store's fault.
    pub fn kind(&self) -> Failure {
        match self {
            Self::Refused(kind, _) => *kind,
            Self::Library(error) if error.is_invalid() => Failure::InvalidArgument,
            Self::Library(_) => Failure::Unavailable,
        }
    }
}
