//! The Redis (or Valkey) store: state shared by every instance of a service.
//!
//! Every decision is one call of one Lua script ([`tollgate.lua`], loaded
//! once and called with `EVALSHA`, reloaded on `NOSCRIPT`), so the read,
//! the decision and the write happen atomically inside Redis: no locks, no
//! read-then-write races. The script reads the server's `TIME` unless the
//! request carries an explicit `now`, so clients with skewed clocks agree.
//!
//! Keys are `<prefix>:{<subject>}:<limit name>`: the braces make the subject a
//! Redis Cluster hash tag, so all limits of one subject share a slot and a
//! policy is one script call. Each key holds one hash and expires when its
//! state no longer carries information. (With an explicit `now` — tests,
//! replays — real time and the caller's time differ, so keys are kept at least
//! an hour; decisions never depend on that, as each state records when it
//! lapses in the caller's time.)
//!
//! The client is redis-rs: one multiplexed connection
//! ([`ConnectionManager`]) serves any number of concurrent tasks without a
//! lock around each call, and reconnects by itself when Redis comes back.
//! Measured against fred on Tollgate's own workload (64 tasks on one client,
//! EVALSHA of this script; `tools/client-choice`), the two were a tie within
//! noise (51–56 k decisions/s each, Redis's script thread the bottleneck),
//! so redis-rs was kept for `Script` (EVALSHA with NOSCRIPT reload),
//! `ConnectionManager` and TLS with a private CA; see `BENCHMARKS.md`.
//!
//! [`tollgate.lua`]: https://docs.rs/tollgate (the script ships inside the crate)

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Value;

use super::Store;
use crate::clock::micros;
use crate::decision::{Decision, Outcome};
use crate::error::{Error, ErrorKind, Result};
use crate::policy::{Op, Policy, Request};
use crate::subject::Subject;

/// The script holding every algorithm.
pub(crate) const SCRIPT: &str = include_str!("tollgate.lua");

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "tollgate";

/// A store in Redis; cheap to clone (clones share the connection).
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    connection: ConnectionManager,
    script: redis::Script,
    prefix: String,
    timeout: Duration,
}

/// Options for a [`RedisStore`]: URL, key prefix, timeouts.
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    url: String,
    prefix: String,
    timeout: Duration,
    connect_timeout: Duration,
    root_certificate: Option<Vec<u8>>,
}

impl RedisStoreBuilder {
    /// For `rediss://`: trust this CA certificate (PEM) instead of the
    /// system's roots — for servers with a private CA.
    #[must_use]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_certificate = Some(pem.into());
        self
    }

    /// The prefix of every key (default `tollgate`); no `{`, `}` or spaces.
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one decision may take before it fails with a timeout
    /// (default 1 s).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long connecting may take (default 5 s).
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Connects, checks the server answers, and loads the script.
    ///
    /// # Errors
    ///
    /// An invalid URL or prefix ([`ErrorKind::InvalidArgument`]); a server that
    /// cannot be reached, refuses the credentials, or is not Redis
    /// ([`ErrorKind::Store`]); no answer in time ([`ErrorKind::Timeout`]).
    pub async fn connect(self) -> Result<RedisStore> {
        let valid_prefix = !self.prefix.is_empty()
            && self
                .prefix
                .bytes()
                .all(|b| b.is_ascii_graphic() && !matches!(b, b'{' | b'}'));
        if !valid_prefix {
            return Err(Error::invalid_argument(format!(
                "key prefix \"{}\" must be printable ASCII without spaces, '{{' or '}}'",
                self.prefix
            )));
        }
        let client = match self.root_certificate {
            Some(root_cert) => redis::Client::build_with_tls(
                self.url.as_str(),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(root_cert),
                },
            ),
            None => redis::Client::open(self.url.as_str()),
        }
        .map_err(|error| {
            Error::invalid_argument(format!("invalid redis url: {}", error.detail().unwrap_or("unreadable")))
        })?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let connect = ConnectionManager::new_with_config(client, config);
        let mut connection = tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| Error::new(ErrorKind::Timeout, "redis: no connection within the connect timeout"))?
            .map_err(store_error)?;
        let script = redis::Script::new(SCRIPT);
        tokio::time::timeout(
            self.connect_timeout,
            script.prepare_invoke().load_async(&mut connection),
        )
        .await
        .map_err(|_| Error::new(ErrorKind::Timeout, "redis: no answer to SCRIPT LOAD"))?
        .map_err(store_error)?;
        Ok(RedisStore {
            inner: Arc::new(Inner {
                connection,
                script,
                prefix: self.prefix,
                timeout: self.timeout,
            }),
        })
    }
}

impl RedisStore {
    /// Options for a store at `url`: `redis://[user:password@]host[:port][/db]`,
    /// or `rediss://` for TLS.
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(5),
            root_certificate: None,
        }
    }

    /// Connects to `url` with the default options.
    ///
    /// # Errors
    ///
    /// As [`RedisStoreBuilder::connect`].
    pub async fn connect(url: &str) -> Result<Self> {
        Self::builder(url).connect().await
    }

    /// The key holding `subject`'s state for the limit `name`.
    pub fn key(&self, subject: &Subject, name: &str) -> String {
        format!("{}:{{{}}}:{name}", self.inner.prefix, subject.as_key())
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    async fn call(&self, invocation: &redis::ScriptInvocation<'_>) -> Result<Vec<Vec<Value>>> {
        let mut connection = self.inner.connection.clone();
        tokio::time::timeout(self.inner.timeout, invocation.invoke_async(&mut connection))
            .await
            .map_err(|_| {
                Error::new(
                    ErrorKind::Timeout,
                    format!("redis: no answer within {:?}", self.inner.timeout),
                )
            })?
            .map_err(store_error)
    }

    fn invocation<'a>(
        &'a self,
        subject: &Subject,
        policy: &Policy,
        request: &Request,
        op: &str,
    ) -> redis::ScriptInvocation<'a> {
        let mut invocation = self.inner.script.prepare_invoke();
        for (name, _) in policy.limits() {
            invocation.key(self.key(subject, name));
        }
        let (max_wait, lease) = match &request.op {
            Op::Reserve { max_wait } => (*max_wait, ""),
            Op::Acquire { lease, max_wait } => (*max_wait, lease.as_str()),
            Op::Release { lease } => (None, lease.as_str()),
            Op::Check | Op::CheckAtMost => (None, ""),
        };
        let max_wait = max_wait.map_or(-1, |max_wait| i64::try_from(micros(max_wait)).unwrap_or(i64::MAX));
        invocation
            .arg(request.now.map(|now| now.as_micros().to_string()).unwrap_or_default())
            .arg(1)
            .arg(op)
            .arg(request.cost)
            .arg(max_wait)
            .arg(lease)
            .arg(0)
            .arg(policy.len());
        for (index, (_, limit)) in policy.limits().enumerate() {
            invocation.arg(limit.algorithm());
            for param in limit.script_params() {
                invocation.arg(param);
            }
            invocation.arg(request.cost_of(index));
        }
        invocation
    }
}

fn store_error(error: redis::RedisError) -> Error {
    let kind = if error.is_timeout() {
        ErrorKind::Timeout
    } else {
        ErrorKind::Store
    };
    // Redis 7 reports WRONGTYPE from inside a script as its code; Redis 6.2
    // wraps it in "Error running script": look at the text too.
    let wrong_type = error.code() == Some("WRONGTYPE") || error.to_string().contains("WRONGTYPE");
    let message = match (error.kind(), wrong_type) {
        (_, true) => "redis: a key of this subject holds another type of value (not written by tollgate?)".to_owned(),
        (redis::ErrorKind::AuthenticationFailed, _) => format!("redis: authentication failed: {error}"),
        _ if error.is_connection_refusal() => format!("redis: connection refused: {error}"),
        _ => format!("redis: {error}"),
    };
    Error::new(kind, message).with_source(error)
}

fn number(value: &Value) -> Result<i64> {
    let parsed = match value {
        Value::Int(number) => Some(*number),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok().and_then(|text| text.parse().ok()),
        Value::SimpleString(text) => text.parse().ok(),
        _ => None,
    };
    parsed.ok_or_else(|| {
        Error::new(
            ErrorKind::Store,
            format!("redis: unexpected reply {value:?} from the script"),
        )
    })
}

fn unsigned(value: &Value) -> Result<u64> {
    u64::try_from(number(value)?).map_err(|_| Error::new(ErrorKind::Store, "redis: negative number from the script"))
}

/// Reads one decision's reply: `{"ok", allowed, granted, n, 6 × n numbers}`.
fn read_reply(policy: &Policy, op: &Op, reply: &[Value]) -> Result<Outcome> {
    let malformed = || Error::new(ErrorKind::Store, "redis: malformed reply from the script");
    let [_, allowed, granted, count, fields @ ..] = reply else {
        return Err(malformed());
    };
    let allowed = number(allowed)? == 1;
    let granted = unsigned(granted)?;
    if usize::try_from(unsigned(count)?).ok() != Some(policy.len()) || fields.len() != 6 * policy.len() {
        return Err(malformed());
    }
    let mut decisions = Vec::with_capacity(policy.len());
    for chunk in fields.chunks_exact(6) {
        let retry_after = number(&chunk[3])?;
        decisions.push(Decision {
            allowed: number(&chunk[0])? == 1,
            limit: unsigned(&chunk[1])?,
            remaining: unsigned(&chunk[2])?,
            retry_after: u64::try_from(retry_after).ok().map(Duration::from_micros),
            reset_after: Duration::from_micros(unsigned(&chunk[4])?),
            wait: Duration::from_micros(unsigned(&chunk[5])?),
        });
    }
    Ok(policy.outcome(op, allowed, granted, decisions.into_iter()))
}

impl Store for RedisStore {
    async fn decide(&self, subject: &Subject, policy: &Policy, request: &Request) -> Result<Outcome> {
        policy.validate(request)?;
        let op = match request.op {
            Op::Check => "check",
            Op::CheckAtMost => "check_at_most",
            Op::Reserve { .. } => "reserve",
            Op::Acquire { .. } => "acquire",
            Op::Release { .. } => "release",
        };
        let replies = self.call(&self.invocation(subject, policy, request, op)).await?;
        let reply = replies
            .first()
            .ok_or_else(|| Error::new(ErrorKind::Store, "redis: empty reply from the script"))?;
        read_reply(policy, &request.op, reply)
    }

    async fn reset(&self, subject: &Subject, policy: &Policy) -> Result<()> {
        let request = Request::new(Op::Check, 0);
        self.call(&self.invocation(subject, policy, &request, "reset")).await?;
        Ok(())
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.inner.prefix)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}
