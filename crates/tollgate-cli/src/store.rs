//! `--store`: which store a subcommand decides in, picked at run time.
//!
//! `memory` is the embedded store; `redis://`, `rediss://` (TLS),
//! `redis+unix://`, `valkey://` and `valkeys://` URLs name a Redis (or
//! Valkey) server; `redis+cluster://host:port[,host:port…]` (or
//! `rediss+cluster://`) a Redis Cluster by its seed nodes, and
//! `redis+sentinel://host:port[,host:port…]/<master name>` the master that
//! these Sentinels know by that name. URLs may carry a password, so messages name only the
//! scheme, and [`redact`] hides the password wherever a URL is shown.

use std::time::Duration;

use tollgate::RedisStore;

use crate::UsageError;

/// What `--store` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// The embedded, in-process store.
    Memory,
    /// A Redis server, by URL.
    Redis(String),
}

impl StoreUrl {
    /// Reads `--store`.
    ///
    /// # Errors
    ///
    /// A URL of no known store.
    pub fn parse(url: &str) -> Result<Self, UsageError> {
        if url == "memory" || url == "memory://" {
            return Ok(Self::Memory);
        }
        match url.split_once("://").map(|(scheme, _)| scheme) {
            Some(
                "redis" | "rediss" | "redis+unix" | "unix" | "valkey" | "valkeys" | "redis+cluster" | "rediss+cluster"
                | "redis+sentinel" | "rediss+sentinel",
            ) => Ok(Self::Redis(url.to_owned())),
            Some(scheme) => Err(UsageError(format!(
                "--store: unknown store \"{scheme}://\" (expected memory or redis://...)"
            ))),
            None => Err(UsageError(format!(
                "--store: unknown store \"{url}\" (expected memory or redis://...)"
            ))),
        }
    }

    /// The store as it may be shown: Redis URLs without their password.
    pub fn display(&self) -> String {
        match self {
            Self::Memory => "memory".to_owned(),
            Self::Redis(url) => redact(url),
        }
    }
}

/// `url` with the password of its user info replaced by `***`.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    // A lone `secret@host` may be a password too: hide whatever is there.
    let user = rest[..at].split_once(':').map_or("", |(user, _)| user);
    format!("{scheme}://{user}:***@{}", &rest[at + 1..])
}

/// Connects to the Redis server at `url` with keys under `prefix`.
///
/// # Errors
///
/// An invalid URL or prefix ([`UsageError`]); a server that cannot be
/// reached or refuses the credentials.
pub async fn connect_redis(url: &str, prefix: &str) -> anyhow::Result<RedisStore> {
    connect_redis_with(redis_builder(url, prefix), url).await
}

/// How the command connects to Redis: the URL, the key prefix and a connect
/// timeout of 5 s.
pub fn redis_builder(url: &str, prefix: &str) -> tollgate::RedisStoreBuilder {
    RedisStore::builder(url).prefix(prefix).connect_timeout(CONNECT_TIMEOUT)
}

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Like [`connect_redis`], with the options of `builder` (for `url`).
///
/// # Errors
///
/// As [`connect_redis`].
pub async fn connect_redis_with(builder: tollgate::RedisStoreBuilder, url: &str) -> anyhow::Result<RedisStore> {
    builder
        .connect_timeout(CONNECT_TIMEOUT)
        .connect()
        .await
        .map_err(|error| {
            if error.is_invalid() {
                anyhow::Error::new(UsageError(format!("--store: {error}")))
            } else {
                anyhow::Error::new(error).context(format!("cannot use the store at {}", redact(url)))
            }
        })
}

pub use tollgate::AnyStore;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_are_chosen_by_url() {
        assert_eq!(StoreUrl::parse("memory").unwrap(), StoreUrl::Memory);
        assert_eq!(
            StoreUrl::parse("rediss://h:6380").unwrap(),
            StoreUrl::Redis("rediss://h:6380".to_owned())
        );
        let error = StoreUrl::parse("etcd://user:secret@x").unwrap_err().0;
        assert!(error.contains("unknown store \"etcd://\""), "{error}");
        assert!(!error.contains("secret"), "{error}");
        assert!(StoreUrl::parse("localhost:6379").is_err());
        for url in [
            "redis+cluster://a:1,b:2",
            "rediss+cluster://a:1",
            "redis+sentinel://a:1,b:2/main",
        ] {
            assert_eq!(StoreUrl::parse(url).unwrap(), StoreUrl::Redis(url.to_owned()));
        }
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("redis://127.0.0.1:6379/0"), "redis://127.0.0.1:6379/0");
        assert_eq!(redact("redis://user:secret@h:1/2"), "redis://user:***@h:1/2");
        assert_eq!(redact("rediss://:secret@h"), "rediss://:***@h");
        assert_eq!(redact("redis://secret@h"), "redis://:***@h");
        assert_eq!(redact("redis://h/a@b"), "redis://h/a@b");
        assert_eq!(
            redact("redis+cluster://u:secret@a:1,b:2"),
            "redis+cluster://u:***@a:1,b:2"
        );
        assert_eq!(
            redact("redis+sentinel://u:secret@a:1,b:2/main?db=1"),
            "redis+sentinel://u:***@a:1,b:2/main?db=1"
        );
    }
}
