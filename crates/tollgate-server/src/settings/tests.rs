use super::*;

fn settings(pairs: &[(&str, &str)]) -> Result<Settings, SettingError> {
    let names: Vec<String> = pairs.iter().map(|(name, _)| (*name).to_owned()).collect();
    let lookup = |name: &str| {
        pairs
            .iter()
            .find(|(each, _)| *each == name)
            .map(|(_, value)| (*value).to_owned())
    };
    Settings::from_lookup(lookup, &names)
}

#[test]
fn defaults_are_envoyproxy_ratelimits() {
    let defaults = settings(&[]).unwrap();
    let config = defaults.config.unwrap();
    assert_eq!(config.path, PathBuf::from("/srv/runtime_data/current/config"));
    assert!(config.options.runtime_layout);
    assert_eq!(config.watch_root, Some(PathBuf::from("/srv/runtime_data")));
    assert_eq!((defaults.http, defaults.grpc, defaults.redis), (None, None, None));
    assert_eq!(defaults.header_names, HeaderNames::default());
    assert!(defaults.ignored.is_empty());
}

#[test]
fn a_container_environment_is_read() {
    let read = settings(&[
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("MERGE_DOMAIN_CONFIG", "1"),
        ("HOST", "0.0.0.0"),
        ("PORT", "9080"),
        ("GRPC_PORT", "9081"),
        ("USE_PROMETHEUS", "true"),
        ("SHADOW_MODE", "True"),
        ("QUOTA_MODE", "false"),
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("LIMIT_REMAINING_HEADER", "X-Left"),
        ("NEAR_LIMIT_RATIO", "0.9"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "redis:6379"),
        ("REDIS_AUTH", "user:p@ss"),
        ("CACHE_KEY_PREFIX", "rl_"),
        ("LOG_LEVEL", "WARNING"),
        ("LOG_FORMAT", "json"),
        ("USE_STATSD", "false"),
        ("LOCAL_CACHE_SIZE_IN_BYTES", "1000"),
    ])
    .unwrap();
    let config = read.config.unwrap();
    assert_eq!(config.path, PathBuf::from("/data/ratelimit/config"));
    assert!(config.options.ignore_dot_files && config.options.merge_domains);
    assert_eq!(config.watch_root, None);
    assert_eq!(read.http, Some("0.0.0.0:9080".parse().unwrap()));
    assert_eq!(read.grpc, Some("127.0.0.1:9081".parse().unwrap()));
    assert_eq!(
        read.prometheus,
        Some(("127.0.0.1:9090".parse().unwrap(), "/metrics".to_owned()))
    );
    assert!(read.shadow_mode && !read.all_alternatives && read.response_headers);
    assert_eq!(read.header_names.remaining, "X-Left");
    assert_eq!(read.header_names.limit, "RateLimit-Limit");
    assert_eq!(read.near_limit_ratio, Some(0.9));
    assert_eq!(read.redis.as_deref(), Some("redis://user:p%40ss@redis:6379"));
    assert_eq!(read.prefix.as_deref(), Some("rl_"));
    assert_eq!(read.log_level.as_deref(), Some("warn"));
    assert!(read.log_json);
    assert_eq!(read.ignored, ["LOCAL_CACHE_SIZE_IN_BYTES", "USE_STATSD"]);
}

/// Settings once accepted without effect now take effect.
#[test]
fn timeout_health_debug_and_descriptor_cap() {
    let read = settings(&[
        ("REDIS_TIMEOUT", "250ms"),
        ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true"),
        ("DEBUG_PORT", "6071"),
        ("MAX_DESCRIPTORS", "50"),
    ])
    .unwrap();
    assert_eq!(read.store_timeout, Some(Duration::from_millis(250)));
    assert!(read.health_checks_store);
    assert_eq!(read.debug, Some("127.0.0.1:6071".parse().unwrap()));
    assert_eq!(read.max_descriptors, Some(50));
    assert!(read.ignored.is_empty(), "{:?}", read.ignored);
    let defaults = settings(&[]).unwrap();
    assert_eq!(
        (
            defaults.store_timeout,
            defaults.health_checks_store,
            defaults.debug,
            defaults.max_descriptors
        ),
        (None, false, None, None)
    );
}

#[test]
fn redis_addresses() {
    let url = |pairs: &[(&str, &str)]| settings(pairs).unwrap().redis;
    assert_eq!(
        url(&[("REDIS_URL", "/var/run/redis.sock"), ("REDIS_AUTH", "secret")]).as_deref(),
        Some("redis+unix:///var/run/redis.sock?pass=secret")
    );
    assert_eq!(
        url(&[
            ("REDIS_URL", "localhost:6379"),
            ("REDIS_TLS", "true"),
            ("REDIS_AUTH", "pw")
        ])
        .as_deref(),
        Some("rediss://:pw@localhost:6379")
    );
    assert_eq!(url(&[("REDIS_URL", "redis://h:1/2")]).as_deref(), Some("redis://h:1/2"));
    assert_eq!(
        url(&[
            ("REDIS_URL", "a:7000,b:7001"),
            ("REDIS_TYPE", "CLUSTER"),
            ("REDIS_AUTH", "pw")
        ])
        .as_deref(),
        Some("redis+cluster://:pw@a:7000,b:7001")
    );
    assert_eq!(
        url(&[
            ("REDIS_URL", "a:7000"),
            ("REDIS_TYPE", "cluster"),
            ("REDIS_TLS", "true")
        ])
        .as_deref(),
        Some("rediss+cluster://a:7000")
    );
    assert_eq!(
        url(&[("REDIS_URL", "mymaster,a:26379,b:26379"), ("REDIS_TYPE", "SENTINEL")]).as_deref(),
        Some("redis+sentinel://a:26379,b:26379/mymaster")
    );
}

#[test]
fn what_cannot_be_honoured_is_refused_by_name() {
    for (pairs, named) in [
        (&[("SHADOW_MODE", "yes")][..], "SHADOW_MODE"),
        (&[("PORT", "http")][..], "PORT"),
        (&[("CONFIG_TYPE", "GRPC_XDS_DELTA")][..], "CONFIG_TYPE"),
        (
            &[
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "later"),
            ][..],
            "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
        ),
        (
            &[
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
                ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/c"),
            ][..],
            "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        ),
        (&[("REDIS_TLS_CLIENT_KEY", "/k")][..], "REDIS_TLS_CLIENT_CERT"),
        (
            &[("TRACING_ENABLED", "true"), ("TRACING_SAMPLING_RATE", "2")][..],
            "TRACING_SAMPLING_RATE",
        ),
        (
            &[("TRACING_ENABLED", "true"), ("TRACING_EXPORTER_PROTOCOL", "grpc")][..],
            "TRACING_EXPORTER_PROTOCOL",
        ),
        (&[("BACKEND_TYPE", "memcache")][..], "BACKEND_TYPE"),
        (&[("REDIS_URL", "a:1,b:2"), ("REDIS_TYPE", "RING")][..], "REDIS_TYPE"),
        (&[("REDIS_URL", "a:1"), ("REDIS_TYPE", "SENTINEL")][..], "REDIS_URL"),
        (&[("GRPC_SERVER_USE_TLS", "true")][..], "GRPC_SERVER_USE_TLS"),
        (&[("GRPC_SERVER_USE_TLS", "maybe")][..], "GRPC_SERVER_USE_TLS"),
        (&[("GRPC_UDS", "/tmp/rl.sock")][..], "GRPC_UDS"),
        (&[("NEAR_LIMIT_RATIO", "most")][..], "NEAR_LIMIT_RATIO"),
        (&[("NEAR_LIMIT_RATIO", "1.5")][..], "NEAR_LIMIT_RATIO"),
        (&[("NEAR_LIMIT_RATIO", "NaN")][..], "NEAR_LIMIT_RATIO"),
        (&[("REDIS_TIMEOUT", "soon")][..], "REDIS_TIMEOUT"),
        (&[("REDIS_TIMEOUT", "0s")][..], "REDIS_TIMEOUT"),
        (
            &[("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "sure")][..],
            "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        ),
        (&[("DEBUG_PORT", "debug")][..], "DEBUG_PORT"),
        (&[("MAX_DESCRIPTORS", "0")][..], "MAX_DESCRIPTORS"),
    ] {
        let error = settings(pairs).unwrap_err().to_string();
        assert!(error.starts_with(named), "{error}");
    }
}

/// The environment Envoy Gateway's rate limit Deployment sets
/// (`internal/infrastructure/kubernetes/ratelimit/resource.go`).
#[test]
fn envoy_gateways_environment_is_read() {
    let read = settings(&[
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("LOG_LEVEL", "info"),
        ("USE_STATSD", "false"),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("CONFIG_GRPC_XDS_NODE_METADATA", "cluster=eg,zone"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
        ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
        ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "redis.redis-system.svc.cluster.local:6379"),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CLIENT_CERT", "/redis-certs/tls.crt"),
        ("REDIS_TLS_CLIENT_KEY", "/redis-certs/tls.key"),
    ])
    .unwrap();
    assert_eq!(read.config, None, "the limits come from xDS, not files");
    let xds = read.xds.unwrap();
    assert_eq!(xds.server, "envoy-gateway:18001");
    assert_eq!(xds.node_id, "envoy-ratelimit");
    assert_eq!(xds.node_metadata, vec![("cluster".to_owned(), "eg".to_owned())]);
    let tls = xds.tls.unwrap();
    assert_eq!(tls.cert, Some(PathBuf::from("/certs/tls.crt")));
    assert_eq!(tls.ca, Some(PathBuf::from("/certs/ca.crt")));
    let grpc = read.grpc_tls.unwrap();
    assert_eq!(
        grpc.client_ca,
        Some(PathBuf::from("/certs/ca.crt")),
        "client certificates required"
    );
    assert_eq!(
        read.redis.as_deref(),
        Some("rediss://redis.redis-system.svc.cluster.local:6379")
    );
    assert_eq!(
        read.redis_tls.client,
        Some((
            PathBuf::from("/redis-certs/tls.crt"),
            PathBuf::from("/redis-certs/tls.key")
        ))
    );
    assert!(read.force_start);
    assert_eq!(read.tracing, None);
    let traced = settings(&[
        ("TRACING_ENABLED", "true"),
        ("TRACING_SERVICE_NAME", "envoy-ratelimit"),
        ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
        ("TRACING_SAMPLING_RATE", "0.5"),
    ])
    .unwrap()
    .tracing
    .unwrap();
    assert_eq!(traced.service_name, "envoy-ratelimit");
    assert_eq!(traced.service_namespace.as_deref(), Some("envoy-gateway-system"));
    assert!((traced.sampling_rate - 0.5).abs() < f64::EPSILON);
}
