//! Store URLs: one server, a Cluster's seed nodes, or a set of Sentinels and
//! the name of the master they watch.
//!
//! One server's URL (`redis://`, `rediss://`, `redis+unix://`…) goes to
//! redis-rs as it is. The Cluster and Sentinel forms list several
//! `host:port` pairs separated by commas, which redis-rs does not read, so
//! they are split here into one URL per node; credentials stay in those URLs
//! and redis-rs decodes them.

use super::EngineChoice;
use crate::error::{Error, Result};

/// Where a store connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Target {
    /// One server: the URL as given.
    Single(String),
    /// A Cluster: one URL per seed node (`redis://` or `rediss://`, with
    /// the credentials of the URL).
    Cluster(Vec<String>),
    /// The master that Sentinels name.
    Sentinel(SentinelTarget),
}

/// `redis+sentinel://[user:password@]host:port[,host:port…]/<master name>[?db=N]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SentinelTarget {
    /// One `redis://host:port` URL per Sentinel (no credentials).
    pub sentinels: Vec<String>,
    /// The name the Sentinels know the master by.
    pub master: String,
    /// `redis://[user:password@]host/<db>`: the credentials and database for
    /// the master, read by redis-rs (the host is a placeholder).
    pub master_settings: String,
}

fn invalid(message: impl std::fmt::Display) -> Error {
    Error::invalid_argument(format!("invalid redis url: {message}"))
}

/// Takes `engine=auto|module|lua` out of a store URL's query: the URL
/// without it, and the choice (`auto` when absent).
pub(super) fn take_engine(url: &str) -> Result<(String, EngineChoice)> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), EngineChoice::Auto));
    };
    let mut choice = EngineChoice::Auto;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("engine", value)) => {
                choice = match value {
                    "auto" => EngineChoice::Auto,
                    "module" => EngineChoice::Module,
                    "lua" => EngineChoice::Lua,
                    _ => return Err(invalid(format!("engine \"{value}\" is not one of auto, module, lua"))),
                };
            }
            _ => kept.push(pair),
        }
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, choice))
}

/// Reads a store URL.
pub(super) fn parse(url: &str) -> Result<Target> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok(Target::Single(url.to_owned()));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "redis+cluster" => cluster("redis", rest),
        "rediss+cluster" => cluster("rediss", rest),
        "redis+sentinel" => sentinel(rest),
        "rediss+sentinel" => Err(invalid(
            "rediss+sentinel:// (TLS to Sentinels) is not supported; use redis+sentinel://",
        )),
        _ => Ok(Target::Single(url.to_owned())),
    }
}

/// Splits `[userinfo@]hosts[/path][?query]`.
struct Parts<'a> {
    userinfo: Option<&'a str>,
    hosts: Vec<&'a str>,
    path: &'a str,
    query: &'a str,
}

fn split<'a>(rest: &'a str, scheme: &str) -> Result<Parts<'a>> {
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(userinfo), hosts),
        None => (None, authority),
    };
    let hosts: Vec<&str> = hosts.split(',').map(str::trim).collect();
    if hosts.iter().any(|host| host.is_empty()) {
        return Err(invalid(format!(
            "{scheme}:// needs one or more host:port, separated by commas"
        )));
    }
    for host in &hosts {
        check_host(host, scheme)?;
    }
    Ok(Parts {
        userinfo,
        hosts,
        path,
        query,
    })
}

/// `host[:port]` or `[v6][:port]`, with a numeric port.
fn check_host(host: &str, scheme: &str) -> Result<()> {
    let port = match host.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((_, rest)) => rest.strip_prefix(':'),
            None => return Err(invalid(format!("{scheme}://: unclosed '[' in host \"{host}\""))),
        },
        None => host.rsplit_once(':').map(|(_, port)| port),
    };
    match port {
        Some(port) if port.parse::<u16>().is_err() => Err(invalid(format!(
            "{scheme}://: port \"{port}\" of host \"{host}\" is not a number from 0 to 65535"
        ))),
        _ => Ok(()),
    }
}

fn cluster(node_scheme: &str, rest: &str) -> Result<Target> {
    let scheme = format!("{node_scheme}+cluster");
    let parts = split(rest, &scheme)?;
    if !matches!(parts.path, "" | "0") {
        return Err(invalid(format!(
            "{scheme}://: a Cluster has only database 0 (the URL names database \"{}\")",
            parts.path
        )));
    }
    if !parts.query.is_empty() {
        return Err(invalid(format!(
            "{scheme}://: no query parameters are read (got \"?{}\")",
            parts.query
        )));
    }
    let credentials = parts
        .userinfo
        .map_or_else(String::new, |userinfo| format!("{userinfo}@"));
    Ok(Target::Cluster(
        parts
            .hosts
            .iter()
            .map(|host| format!("{node_scheme}://{credentials}{host}"))
            .collect(),
    ))
}

fn sentinel(rest: &str) -> Result<Target> {
    let scheme = "redis+sentinel";
    let parts = split(rest, scheme)?;
    let master = parts.path.trim_end_matches('/');
    if master.is_empty() || master.contains('/') {
        return Err(invalid(
            "redis+sentinel:// needs the master's name after the hosts \
             (redis+sentinel://host:port[,host:port...]/<master name>[?db=N])",
        ));
    }
    let mut db = 0;
    for pair in parts.query.split('&').filter(|pair| !pair.is_empty()) {
        match pair.split_once('=') {
            Some(("db", value)) => {
                db = value
                    .parse::<u32>()
                    .map_err(|_| invalid(format!("redis+sentinel://: db \"{value}\" is not a database number")))?;
            }
            _ => {
                return Err(invalid(format!(
                    "redis+sentinel://: unknown parameter \"{pair}\" (expected db=N)"
                )))
            }
        }
    }
    let credentials = parts
        .userinfo
        .map_or_else(String::new, |userinfo| format!("{userinfo}@"));
    Ok(Target::Sentinel(SentinelTarget {
        sentinels: parts.hosts.iter().map(|host| format!("redis://{host}")).collect(),
        master: master.to_owned(),
        master_settings: format!("redis://{credentials}localhost/{db}"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_is_taken_out_of_any_url() {
        assert_eq!(
            take_engine("redis://h:1").unwrap(),
            ("redis://h:1".to_owned(), EngineChoice::Auto)
        );
        assert_eq!(
            take_engine("redis://h:1/2?engine=module").unwrap(),
            ("redis://h:1/2".to_owned(), EngineChoice::Module)
        );
        assert_eq!(
            take_engine("redis+sentinel://h:1/m?db=2&engine=lua").unwrap(),
            ("redis+sentinel://h:1/m?db=2".to_owned(), EngineChoice::Lua)
        );
        let error = take_engine("redis://h?engine=fast").unwrap_err().to_string();
        assert!(error.contains("engine \"fast\""), "{error}");
    }

    #[test]
    fn one_server_urls_pass_through() {
        for url in [
            "redis://h:1/2",
            "rediss://u:p@h",
            "redis+unix:///tmp/r.sock",
            "not a url",
        ] {
            assert_eq!(parse(url).unwrap(), Target::Single(url.to_owned()));
        }
    }

    #[test]
    fn cluster_seeds_become_node_urls() {
        assert_eq!(
            parse("redis+cluster://a:7000,b:7001").unwrap(),
            Target::Cluster(vec!["redis://a:7000".into(), "redis://b:7001".into()])
        );
        assert_eq!(
            parse("rediss+cluster://u:p%40ss@a:7000,[::1]:7001/").unwrap(),
            Target::Cluster(vec![
                "rediss://u:p%40ss@a:7000".into(),
                "rediss://u:p%40ss@[::1]:7001".into()
            ])
        );
    }

    #[test]
    fn bad_cluster_urls_name_the_problem() {
        for (url, expected) in [
            ("redis+cluster://", "host:port"),
            ("redis+cluster://a:1,,b:2", "host:port"),
            ("redis+cluster://a:x", "port \"x\""),
            ("redis+cluster://a:1/3", "only database 0"),
            ("redis+cluster://a:1?db=2", "no query"),
        ] {
            let error = parse(url).unwrap_err();
            assert!(
                error.is_invalid() && error.to_string().contains(expected),
                "{url}: {error}"
            );
        }
    }

    #[test]
    fn sentinel_urls() {
        assert_eq!(
            parse("redis+sentinel://u:p@a:26379,b:26380/mymaster?db=3").unwrap(),
            Target::Sentinel(SentinelTarget {
                sentinels: vec!["redis://a:26379".into(), "redis://b:26380".into()],
                master: "mymaster".into(),
                master_settings: "redis://u:p@localhost/3".into(),
            })
        );
        for (url, expected) in [
            ("redis+sentinel://a:26379", "master's name"),
            ("redis+sentinel://a:26379/", "master's name"),
            ("redis+sentinel://a:26379/m?db=x", "db \"x\""),
            ("redis+sentinel://a:26379/m?timeout=1", "unknown parameter"),
            ("rediss+sentinel://a:26379/m", "not supported"),
        ] {
            let error = parse(url).unwrap_err();
            assert!(
                error.is_invalid() && error.to_string().contains(expected),
                "{url}: {error}"
            );
        }
    }
}
