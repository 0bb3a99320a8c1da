//! The store `serve` decides on: the memory store, a Redis behind the
//! failure policy, or a region's Redis beside the home Redis of global
//! limits; Redis's TLS files and the alert outbox as the settings say.

use std::time::Duration;

use anyhow::Context as _;
use tollgate::{AnyStore, MemoryStore, OnStoreError, ResilientStore};
use tollgate_server::settings::{RedisTls, Settings};

use super::Args;
use crate::store::{connect_redis_with, redis_builder, StoreUrl};
use crate::UsageError;

/// How serve uses its Redis.
pub(super) struct Connection<'a> {
    prefix: &'a str,
    tls: &'a RedisTls,
    on_error: OnStoreError,
    timeout: Duration,
    deny_cache: usize,
    /// Alerts are written to the store's outbox (a webhook takes them).
    outbox: bool,
}

impl<'a> Connection<'a> {
    /// As the flags and settings say, keys under `prefix`, with an alert
    /// outbox when `outbox`.
    pub(super) fn of(args: &Args, settings: &'a Settings, prefix: &'a str, outbox: bool) -> Self {
        Self {
            prefix,
            tls: &settings.redis_tls,
            on_error: args.on_store_error,
            timeout: args
                .store_timeout
                .or(settings.store_timeout)
                .unwrap_or(Duration::from_millis(100)),
            deny_cache: args.deny_cache,
            outbox,
        }
    }
}

/// The store `--redis` names (the embedded memory store without it).
async fn store(redis: Option<&str>, connection: &Connection<'_>) -> anyhow::Result<AnyStore> {
    Ok(match redis {
        None => AnyStore::Memory(MemoryStore::new()),
        Some(url) => match StoreUrl::parse(url)? {
            StoreUrl::Redis(url) => AnyStore::Resilient(
                redis_store(&url, connection)
                    .await?
                    .on_error(connection.on_error)
                    .timeout(connection.timeout)
                    .deny_cache(connection.deny_cache)
                    .build(),
            ),
            StoreUrl::Memory => AnyStore::Memory(MemoryStore::new()),
        },
    })
}

/// The store the flags name: the region's with --global-redis, else the
/// one --redis names (the memory store without it).
pub(super) async fn any_store(
    args: &Args,
    redis: Option<&str>,
    connection: &Connection<'_>,
) -> anyhow::Result<AnyStore> {
    let global = args
        .global_redis
        .clone()
        .or_else(|| std::env::var("GLOBAL_REDIS_URL").ok().filter(|url| !url.is_empty()));
    let region = args
        .region
        .clone()
        .or_else(|| std::env::var("REGION").ok().filter(|name| !name.is_empty()));
    match (global, region, redis) {
        (None, _, redis) => store(redis, connection).await,
        (Some(home), Some(region), Some(redis)) => {
            regional_store(redis, &home, &region, args.global_fraction, connection).await
        }
        (Some(_), None, _) => Err(UsageError("--global-redis needs --region (or REGION)".into()).into()),
        (Some(_), _, None) => Err(UsageError("--global-redis needs --redis, this region's Redis".into()).into()),
    }
}

/// A region's store: its own Redis at `redis` (behind the failure policy),
/// and the home Redis of global limits at `home`. Both must answer now.
async fn regional_store(
    redis: &str,
    home: &str,
    region: &str,
    fraction: f64,
    connection: &Connection<'_>,
) -> anyhow::Result<AnyStore> {
    if !(0.0..=1.0).contains(&fraction) {
        return Err(UsageError(format!("--global-fraction: {fraction} is not a fraction from 0 to 1")).into());
    }
    let tls = connection.tls;
    let connect = |url: String, timeout: Duration, outbox: bool| async move {
        let url = with_redis_tls(&url, tls);
        let mut builder = redis_tls_files(redis_builder(&url, connection.prefix).timeout(timeout), tls)?;
        if outbox {
            builder = builder.alert_outbox(tollgate_server::service::OUTBOX_KEPT);
        }
        connect_redis_with(builder, &url).await
    };
    let local_url = match StoreUrl::parse(redis)? {
        StoreUrl::Redis(url) => url,
        StoreUrl::Memory => return Err(UsageError("--global-redis needs --redis to name a Redis".into()).into()),
    };
    let home_url = match StoreUrl::parse(home)? {
        StoreUrl::Redis(url) => url,
        StoreUrl::Memory => return Err(UsageError("--global-redis: expected a Redis URL".into()).into()),
    };
    let regional = connect(local_url, connection.timeout, connection.outbox).await?;
    // Home is far: its calls (a block, a report) get a second at least.
    let home = connect(home_url, connection.timeout.max(Duration::from_secs(1)), false)
        .await
        .context("the home Redis (--global-redis)")?;
    tracing::info!(region, "regions: this region's Redis and the home Redis connected");
    let local = ResilientStore::builder(regional.clone())
        .on_error(connection.on_error)
        .timeout(connection.timeout)
        .deny_cache(connection.deny_cache)
        .build();
    Ok(AnyStore::Regional(
        tollgate::RegionalStore::with_local(local, regional, home, region)
            .on_home_error(connection.on_error, fraction)
            .build(),
    ))
}

/// The Redis store at `url`, ready for its resilience options. With the
/// `error` policy it must answer now (as envoyproxy/ratelimit, serve does
/// not start without it); with another policy, a server that does not answer
/// yet is connected in the background while the policy answers.
async fn redis_store(
    url: &str,
    connection: &Connection<'_>,
) -> anyhow::Result<tollgate::ResilientStoreBuilder<tollgate::RedisStore>> {
    let (tls, on_error) = (connection.tls, connection.on_error);
    let url = &with_redis_tls(url, tls);
    // The store's own timeout is the deadline too: a durable record bounds
    // its wait inside it, and so answers "not durable" before the deadline
    // answers "no answer" (a fault of the store's).
    let builder = || {
        let builder = redis_tls_files(redis_builder(url, connection.prefix).timeout(connection.timeout), tls)?;
        anyhow::Ok(if connection.outbox {
            builder.alert_outbox(tollgate_server::service::OUTBOX_KEPT)
        } else {
            builder
        })
    };
    match connect_redis_with(builder()?, url).await {
        Ok(store) => {
            tracing::info!(engine = %store.engine(), "redis: connected");
            Ok(ResilientStore::builder(store))
        }
        Err(error) if on_error == OnStoreError::Error || error.is::<UsageError>() => Err(error),
        Err(error) => {
            tracing::warn!(
                error = %crate::one_line(&error),
                policy = on_error.as_str(),
                "the store does not answer yet: starting, and connecting in the background"
            );
            let builder = builder()?;
            Ok(ResilientStore::connecting(Box::new(move || {
                let builder = builder.clone();
                Box::pin(async move {
                    let store = builder.connect().await?;
                    tracing::info!(engine = %store.engine(), "redis: connected");
                    Ok(store)
                })
            })))
        }
    }
}

/// `url`, without a check of the server's certificate when
/// `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION` asks (the Redis client's
/// `#insecure`: no name check, and no chain check either).
fn with_redis_tls(url: &str, tls: &RedisTls) -> String {
    if tls.skip_hostname_verification && url.starts_with("rediss") && !url.contains('#') {
        format!("{url}#insecure")
    } else {
        url.to_owned()
    }
}

/// `builder`, with the CA and client certificate `REDIS_TLS_*` name.
fn redis_tls_files(
    mut builder: tollgate::RedisStoreBuilder,
    tls: &RedisTls,
) -> anyhow::Result<tollgate::RedisStoreBuilder> {
    let read = |name: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|error| UsageError(format!("{name}={}: {error}", path.display())))
    };
    if let Some(ca) = &tls.ca {
        builder = builder.tls_root_certificate(read("REDIS_TLS_CACERT", ca)?);
    }
    if let Some((cert, key)) = &tls.client {
        builder =
            builder.tls_client_certificate(read("REDIS_TLS_CLIENT_CERT", cert)?, read("REDIS_TLS_CLIENT_KEY", key)?);
    }
    Ok(builder)
}
