//! Who may read and change what `serve` holds: an admin token opens every
//! route behind it (overrides, usage, top, the console's changes); a
//! read-only token opens what reads (usage, top, the override list, the
//! console's pages) and nothing that changes.
//!
//! A request carries its token as `Authorization: Bearer <token>`. Tokens
//! are compared through SHA-256 digests in constant time, so neither their
//! bytes nor their length can be guessed from timings. A route whose token
//! is not configured is off (404, saying how to turn it on); a request
//! without a valid token is refused with 401 (`WWW-Authenticate: Bearer`);
//! a read-only token asking to change something, with 403.

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use super::error;

/// A token (admin or read-only), kept as its digest.
#[derive(Clone)]
pub struct AdminToken {
    digest: [u8; 32],
}

impl AdminToken {
    /// The token `text` (surrounding white space dropped, as a file's
    /// trailing newline); `None` when it is empty.
    pub fn new(text: &str) -> Option<Self> {
        let text = text.trim();
        (!text.is_empty()).then(|| Self {
            digest: Sha256::digest(text.as_bytes()).into(),
        })
    }

    /// True when `given` is the token.
    fn is(&self, given: &[u8; 32]) -> bool {
        bool::from(given.ct_eq(&self.digest))
    }
}

/// The tokens configured.
#[derive(Clone, Default)]
pub struct Access {
    /// Opens everything.
    pub admin: Option<AdminToken>,
    /// Opens what reads.
    pub read: Option<AdminToken>,
}

/// What a request's token opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Grant {
    /// Everything.
    Admin,
    /// What reads.
    Read,
    /// Nothing.
    None,
}

impl Access {
    /// True when some token is configured (the routes behind one are on).
    pub(super) fn is_on(&self) -> bool {
        self.admin.is_some() || self.read.is_some()
    }

    /// What `headers`' bearer token opens.
    pub(super) fn grant(&self, headers: &HeaderMap) -> Grant {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .unwrap_or("");
        let digest: [u8; 32] = Sha256::digest(given.trim().as_bytes()).into();
        // Both compared, whichever matches, so timings say nothing.
        let admin = self.admin.as_ref().is_some_and(|token| token.is(&digest));
        let read = self.read.as_ref().is_some_and(|token| token.is(&digest));
        if admin {
            Grant::Admin
        } else if read {
            Grant::Read
        } else {
            Grant::None
        }
    }

    /// The refusal of a request to read `what` that no token opens.
    pub(super) fn refuse_read(&self, headers: &HeaderMap, what: &str) -> Option<Response> {
        if !self.is_on() {
            return Some(off(what, true));
        }
        match self.grant(headers) {
            Grant::Admin | Grant::Read => None,
            Grant::None => Some(unauthorized()),
        }
    }

    /// The refusal of a request to change `what` that the admin token does
    /// not open.
    pub(super) fn refuse_change(&self, headers: &HeaderMap, what: &str) -> Option<Response> {
        if self.admin.is_none() {
            return Some(off(what, false));
        }
        match self.grant(headers) {
            Grant::Admin => None,
            Grant::Read => Some(error(
                StatusCode::FORBIDDEN,
                "the read-only token cannot change anything: use the admin token",
            )),
            Grant::None => Some(unauthorized()),
        }
    }
}

/// The answer of a route that no configured token opens.
fn off(what: &str, read_opens: bool) -> Response {
    let admin = "an admin token (--admin-token-file, or TOLLGATE_ADMIN_TOKEN)";
    let how = if read_opens {
        format!("{admin} or a read-only token (--read-token-file, or TOLLGATE_READ_TOKEN)")
    } else {
        admin.to_owned()
    };
    error(StatusCode::NOT_FOUND, format!("{what} is off: start serve with {how}"))
}

fn unauthorized() -> Response {
    let mut response = error(
        StatusCode::UNAUTHORIZED,
        "a token is required: Authorization: Bearer <token>",
    );
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}
