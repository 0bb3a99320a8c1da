//! The settings of the configuration source (`CONFIG_TYPE`, `CONFIG_GRPC_XDS_*`,
//! `XDS_CLIENT_*`) and of TLS (`GRPC_SERVER_*`, `GRPC_CLIENT_*`, `REDIS_TLS_*`).

use std::path::PathBuf;
use std::time::Duration;

use super::{invalid, Env, SettingError, Settings};
use crate::tls::{ClientTls, ServerTls};
use crate::xds::XdsSettings;

/// `REDIS_TLS_*`: what the Redis client presents and trusts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// The client certificate and key, PEM (`REDIS_TLS_CLIENT_CERT`, `REDIS_TLS_CLIENT_KEY`).
    pub client: Option<(PathBuf, PathBuf)>,
    /// The CA the server's certificate must chain to (`REDIS_TLS_CACERT`).
    pub ca: Option<PathBuf>,
    /// Do not check the server's name (`REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`).
    pub skip_hostname_verification: bool,
}

/// `TRACING_*`: spans of each decision over OTLP (the endpoint from the
/// OpenTelemetry variables, `OTEL_EXPORTER_OTLP_ENDPOINT`).
#[derive(Debug, Clone, PartialEq)]
pub struct TracingSettings {
    /// `TRACING_SERVICE_NAME` (`RateLimit`).
    pub service_name: String,
    /// `TRACING_SERVICE_NAMESPACE`.
    pub service_namespace: Option<String>,
    /// `TRACING_SERVICE_INSTANCE_ID`.
    pub service_instance_id: Option<String>,
    /// `TRACING_SAMPLING_RATE` (1: every decision), the share of traces kept.
    pub sampling_rate: f64,
}

impl Env<'_> {
    fn path(&self, name: &str) -> Option<PathBuf> {
        self.text(name).map(PathBuf::from)
    }

    /// A Go duration as envconfig reads it (`3s`, `500ms`, `1.5s`, `1m`).
    fn duration(&self, name: &str, default: Duration) -> Result<Duration, SettingError> {
        match self.text(name) {
            None => Ok(default),
            Some(text) => {
                tollgate::duration::parse_duration(&text).map_err(|error| invalid(name, &text, error.to_string()))
            }
        }
    }

    /// `k<separator>v,k2<separator>v2`, entries without the separator skipped (as upstream).
    fn pairs(&self, name: &str, separator: char) -> Vec<(String, String)> {
        self.text(name)
            .map(|text| {
                text.split(',')
                    .filter_map(|entry| entry.split_once(separator))
                    .map(|(key, value)| (key.trim().to_owned(), value.trim().to_owned()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Settings {
    /// `CONFIG_TYPE` and, for `GRPC_XDS_SOTW`, the xDS client's settings.
    /// True when the configuration comes from files.
    pub(super) fn read_source(&mut self, env: &Env<'_>) -> Result<bool, SettingError> {
        let kind = env.text("CONFIG_TYPE").unwrap_or_else(|| "FILE".to_owned());
        if kind.eq_ignore_ascii_case("FILE") {
            return Ok(true);
        }
        if !kind.eq_ignore_ascii_case("GRPC_XDS_SOTW") {
            return Err(invalid("CONFIG_TYPE", &kind, "expected FILE or GRPC_XDS_SOTW"));
        }
        let defaults = XdsSettings::default();
        let tls = if env.flag("CONFIG_GRPC_XDS_SERVER_USE_TLS")? {
            Some(ClientTls {
                cert: env.path("CONFIG_GRPC_XDS_CLIENT_TLS_CERT"),
                key: env.path("CONFIG_GRPC_XDS_CLIENT_TLS_KEY"),
                ca: env.path("CONFIG_GRPC_XDS_SERVER_TLS_CACERT"),
                server_name: env.text("CONFIG_GRPC_XDS_SERVER_TLS_SAN"),
            })
        } else {
            None
        };
        if let Some(tls) = &tls {
            if tls.cert.is_some() != tls.key.is_some() {
                return Err(SettingError::Pair(
                    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
                    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
                ));
            }
        }
        let max_message_bytes =
            match env.text("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES") {
                None => None,
                Some(text) => Some(text.parse::<usize>().ok().filter(|bytes| *bytes > 0).ok_or_else(|| {
                    invalid("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", &text, "not a whole number of bytes")
                })?),
            };
        let node_metadata = env.pairs("CONFIG_GRPC_XDS_NODE_METADATA", '=');
        self.xds = Some(XdsSettings {
            server: env.text("CONFIG_GRPC_XDS_SERVER_URL").unwrap_or(defaults.server),
            node_id: env.text("CONFIG_GRPC_XDS_NODE_ID").unwrap_or(defaults.node_id),
            node_metadata,
            tls,
            headers: env.pairs("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", ':'),
            connect_retry: env.duration("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", defaults.connect_retry)?,
            backoff_initial: env.duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", defaults.backoff_initial)?,
            backoff_max: env.duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL", defaults.backoff_max)?,
            max_message_bytes,
            merge_domains: self.merge_domains,
        });
        Ok(false)
    }

    /// `TRACING_*`.
    pub(super) fn read_tracing(&mut self, env: &Env<'_>) -> Result<(), SettingError> {
        if !env.flag("TRACING_ENABLED")? {
            return Ok(());
        }
        if let Some(protocol) = env.text("TRACING_EXPORTER_PROTOCOL") {
            if !protocol.eq_ignore_ascii_case("http") {
                return Err(invalid(
                    "TRACING_EXPORTER_PROTOCOL",
                    &protocol,
                    "only http (OTLP over HTTP, upstream's default) is supported",
                ));
            }
        }
        let sampling_rate = match env.text("TRACING_SAMPLING_RATE") {
            None => 1.0,
            Some(text) => text
                .parse::<f64>()
                .ok()
                .filter(|rate| (0.0..=1.0).contains(rate))
                .ok_or_else(|| invalid("TRACING_SAMPLING_RATE", &text, "not a number from 0 to 1"))?,
        };
        self.tracing = Some(TracingSettings {
            service_name: env
                .text("TRACING_SERVICE_NAME")
                .unwrap_or_else(|| "RateLimit".to_owned()),
            service_namespace: env.text("TRACING_SERVICE_NAMESPACE"),
            service_instance_id: env.text("TRACING_SERVICE_INSTANCE_ID"),
            sampling_rate,
        });
        Ok(())
    }

    /// `GRPC_SERVER_USE_TLS` and its files; `REDIS_TLS_*`.
    pub(super) fn read_tls(&mut self, env: &Env<'_>) -> Result<(), SettingError> {
        if env.flag("GRPC_SERVER_USE_TLS")? {
            let (Some(cert), Some(key)) = (env.path("GRPC_SERVER_TLS_CERT"), env.path("GRPC_SERVER_TLS_KEY")) else {
                return Err(SettingError::Needs {
                    name: "GRPC_SERVER_USE_TLS",
                    needs: "GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY",
                });
            };
            self.grpc_tls = Some(ServerTls {
                cert,
                key,
                client_ca: env
                    .path("GRPC_CLIENT_TLS_CACERT")
                    .or_else(|| env.path("GRPC_SERVER_TLS_CA_CERT")),
                client_san: env.text("GRPC_CLIENT_TLS_SAN"),
            });
        }
        let client = match (env.path("REDIS_TLS_CLIENT_CERT"), env.path("REDIS_TLS_CLIENT_KEY")) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err(SettingError::Pair("REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY")),
        };
        self.redis_tls = RedisTls {
            client,
            ca: env.path("REDIS_TLS_CACERT"),
            skip_hostname_verification: env.flag("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")?,
        };
        Ok(())
    }
}
