//! `tollgate override set | list | delete`: a running server's overrides
//! (`/v1/overrides`), with the admin token from `--token-file` or
//! `TOLLGATE_ADMIN_TOKEN`.

use clap::{Args as ClapArgs, Subcommand};
use serde_json::{json, Value};

use crate::api::{descriptor, Target};
use crate::serve::ADMIN_TOKEN_ENV;
use crate::UsageError;

/// Change a running server's limits for one descriptor (its overrides API).
#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

/// The server, and the descriptor an override is for.
#[derive(Debug, ClapArgs)]
struct Which {
    #[command(flatten)]
    target: Target,
    /// The domain.
    #[arg(long)]
    domain: String,
    /// One entry of the descriptor, `key=value`, outermost first (repeat
    /// for each).
    #[arg(long = "entry", value_name = "KEY=VALUE", required = true, value_parser = crate::arg::entry)]
    entries: Vec<(String, String)>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Sets (or replaces) the limit of one exact descriptor.
    Set {
        #[command(flatten)]
        which: Which,
        /// Requests per unit (with --unit).
        #[arg(long, value_name = "N")]
        requests_per_unit: Option<u64>,
        /// second, minute, hour, day, week, month or year.
        #[arg(long)]
        unit: Option<String>,
        /// Never limited.
        #[arg(long)]
        unlimited: bool,
        /// Tollgate's algorithm block, as JSON (`{"algorithm": "gcra", …}`).
        #[arg(long, value_name = "JSON")]
        algorithm: Option<String>,
        /// How long it lasts (`2h`); it ends by itself then.
        #[arg(long, value_name = "DURATION")]
        ttl: Option<String>,
        /// When it ends (RFC 3339).
        #[arg(long, value_name = "INSTANT")]
        expires_at: Option<String>,
        /// Why (logged with the change, and listed).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Lists the overrides in force.
    List {
        #[command(flatten)]
        target: Target,
        /// Only this domain's.
        #[arg(long)]
        domain: Option<String>,
    },
    /// Removes the override of one descriptor: its rule applies again.
    Delete {
        #[command(flatten)]
        which: Which,
    },
}

/// Runs the subcommand; prints the server's answer (JSON).
///
/// # Errors
///
/// Invalid arguments, a server that cannot be reached, or its refusal (its
/// message).
pub fn run(args: &Args) -> anyhow::Result<()> {
    let (method, target, body, query) = match &args.command {
        Command::Set {
            which: Which {
                target,
                domain,
                entries,
            },
            requests_per_unit,
            unit,
            unlimited,
            algorithm,
            ttl,
            expires_at,
            reason,
        } => {
            let mut rate_limit = serde_json::Map::new();
            if let Some(unit) = unit {
                rate_limit.insert("unit".into(), json!(unit));
            }
            if let Some(requests) = requests_per_unit {
                rate_limit.insert("requests_per_unit".into(), json!(requests));
            }
            if *unlimited {
                rate_limit.insert("unlimited".into(), json!(true));
            }
            if let Some(algorithm) = algorithm {
                let block: Value = serde_json::from_str(algorithm)
                    .map_err(|error| UsageError(format!("--algorithm: invalid JSON: {error}")))?;
                rate_limit.insert("algorithm".into(), block);
            }
            if rate_limit.is_empty() {
                return Err(UsageError(
                    "a limit is required: --requests-per-unit and --unit, --unlimited, or --algorithm".to_owned(),
                )
                .into());
            }
            let mut body = json!({
                "domain": domain,
                "descriptor": descriptor(entries),
                "rate_limit": rate_limit,
            });
            for (name, value) in [("ttl", ttl), ("expires_at", expires_at), ("reason", reason)] {
                if let Some(value) = value {
                    body[name] = json!(value);
                }
            }
            (reqwest::Method::PUT, target, Some(body), None)
        }
        Command::List { target, domain } => (reqwest::Method::GET, target, None, domain.clone()),
        Command::Delete {
            which: Which {
                target,
                domain,
                entries,
            },
        } => {
            let body = json!({ "domain": domain, "descriptor": descriptor(entries) });
            (reqwest::Method::DELETE, target, Some(body), None)
        }
    };
    let query: Vec<(&str, String)> = query.into_iter().map(|domain| ("domain", domain)).collect();
    let answer = target.call(method, "/v1/overrides", &query, body.as_ref(), &[ADMIN_TOKEN_ENV])?;
    println!("{}", serde_json::to_string_pretty(&answer)?);
    Ok(())
}
