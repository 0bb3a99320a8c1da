//! `tollgate usage`: where a running server's limits stand below a prefix
//! of entries (`GET /v1/usage`), every page of it, as a table (or the
//! server's JSON with `--json`). The token: `--token-file`, else
//! `TOLLGATE_READ_TOKEN`, else `TOLLGATE_ADMIN_TOKEN`.

use std::fmt::Write as _;

use clap::Args as ClapArgs;
use serde_json::Value;

use crate::api::Target;
use crate::serve::{ADMIN_TOKEN_ENV, READ_TOKEN_ENV};

/// Show where every limit below a descriptor prefix stands (consumes
/// nothing).
#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(flatten)]
    target: Target,
    /// The domain.
    #[arg(long)]
    domain: String,
    /// One entry of the prefix, `key=value`, outermost first (repeat for
    /// each; none: the whole domain).
    #[arg(long = "entry", value_name = "KEY=VALUE", value_parser = crate::arg::entry)]
    entries: Vec<(String, String)>,
    /// Print the server's answer (JSON, every page in one `usage` list).
    #[arg(long)]
    json: bool,
}

/// Runs the command: every page, then the table.
///
/// # Errors
///
/// No token, a server that cannot be reached, or its refusal.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let mut usage: Vec<Value> = Vec::new();
    let mut cursor: Option<String> = None;
    let varying = loop {
        let mut query: Vec<(&str, String)> = vec![("domain", args.domain.clone())];
        query.extend(args.entries.iter().map(|(key, value)| (key.as_str(), value.clone())));
        if let Some(cursor) = cursor.take() {
            query.push(("cursor", cursor));
        }
        let page = args.target.call(
            reqwest::Method::GET,
            "/v1/usage",
            &query,
            None,
            &[READ_TOKEN_ENV, ADMIN_TOKEN_ENV],
        )?;
        usage.extend(page["usage"].as_array().cloned().unwrap_or_default());
        match page["cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break page["varying"].clone(),
        }
    };
    if args.json {
        let answer = serde_json::json!({ "domain": args.domain, "usage": usage, "varying": varying });
        println!("{}", serde_json::to_string_pretty(&answer)?);
    } else {
        print!("{}", table(&usage, &varying));
    }
    Ok(())
}

/// The usage rows as a table, then the rules whose descriptors vary.
fn table(usage: &[Value], varying: &Value) -> String {
    let mut rows = vec![["DESCRIPTOR", "RULE", "LIMIT", "USED", "REMAINING", "RESETS AT", "FLAGS"].map(str::to_owned)];
    for row in usage {
        let entries: Vec<String> = row["descriptor"]
            .as_array()
            .map(|entries| {
                entries
                    .iter()
                    .map(|entry| format!("{}={}", text(&entry["key"]), text(&entry["value"])))
                    .collect()
            })
            .unwrap_or_default();
        let limit = match (&row["limit"], row["unit"].as_str()) {
            (Value::Null, _) if row["unlimited"] == Value::Bool(true) => "unlimited".to_owned(),
            (Value::Null, _) => "-".to_owned(),
            (limit, Some(unit)) => format!("{limit}/{unit}"),
            (limit, None) => limit.to_string(),
        };
        let mut flags = Vec::new();
        for flag in ["override", "shadow_mode"] {
            if row[flag] == Value::Bool(true) {
                flags.push(flag);
            }
        }
        rows.push([
            entries.join(", "),
            text(&row["rule"]),
            limit,
            text(&row["used"]),
            text(&row["remaining"]),
            text(&row["resets_at"]),
            flags.join(" "),
        ]);
    }
    let widths: Vec<usize> = (0..7)
        .map(|column| rows.iter().map(|row| row[column].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (column, cell) in row.iter().enumerate() {
            let _ = write!(line, "{cell:<width$}  ", width = widths[column]);
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    for rule in varying.as_array().into_iter().flatten() {
        let path: Vec<String> = rule["descriptor"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|entry| match entry["value"].as_str() {
                Some(value) => format!("{}={value}", text(&entry["key"])),
                None => format!("{}=*", text(&entry["key"])),
            })
            .collect();
        let _ = writeln!(out, "varies: {} ({})", text(&rule["rule"]), path.join(", "));
    }
    out
}

/// A JSON value as a cell: strings bare, null as "-".
fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}
