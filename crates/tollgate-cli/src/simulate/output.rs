//! Writing answers: JSON Lines (the contract of DESIGN §6) or a table.
//!
//! The JSON is written by hand rather than through serde so that the key
//! order is fixed and durations come out exact: whole milliseconds as
//! integers (`100`, never `100.0`), anything finer with up to three decimals
//! (`142.858`), computed from integer microseconds with no float in between.

use std::fmt::Write as _;
use std::time::Duration;

use tollgate::Decision;

use super::{Answer, Decided};

/// `micros` as milliseconds: `100`, `1.5`, `142.858`.
pub fn millis(micros: u64) -> String {
    let (whole, fraction) = (micros / 1_000, micros % 1_000);
    if fraction == 0 {
        return whole.to_string();
    }
    let digits = format!("{fraction:03}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

fn duration(duration: Duration) -> String {
    millis(u64::try_from(duration.as_micros()).unwrap_or(u64::MAX))
}

/// `text` as a JSON string, quoted and escaped.
fn quote(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

fn decision_fields(out: &mut String, decision: &Decision) {
    let retry_after = decision.retry_after.map_or_else(|| "null".to_owned(), duration);
    let _ = write!(
        out,
        "\"allowed\":{},\"limit\":{},\"remaining\":{},\"retry_after_ms\":{},\"reset_after_ms\":{},\"wait_ms\":{}",
        decision.allowed,
        decision.limit,
        decision.remaining,
        retry_after,
        duration(decision.reset_after),
        duration(decision.wait),
    );
}

/// One answer as a line of JSON (without the newline).
pub fn json(answer: &Answer) -> String {
    let decided = match &answer.result {
        Ok(decided) => decided,
        Err(message) => return format!("{{\"error\":{}}}", quote(&message.to_string())),
    };
    let mut out = String::from("{");
    decision_fields(&mut out, &decided.decision);
    if let Some(granted) = decided.granted {
        let _ = write!(out, ",\"granted\":{granted}");
    }
    if let Some(lease) = &decided.lease {
        let _ = write!(out, ",\"lease\":{}", quote(lease));
    }
    if !decided.limits.is_empty() {
        out.push_str(",\"limits\":{");
        for (at, (name, decision)) in decided.limits.iter().enumerate() {
            if at > 0 {
                out.push(',');
            }
            out.push_str(&quote(name));
            out.push_str(":{");
            decision_fields(&mut out, decision);
            out.push('}');
        }
        out.push('}');
    }
    out.push('}');
    out
}

/// Lays out one table line; the last column is free text.
fn columns(cells: [&str; 9], notes: &str) -> String {
    let [t_ms, key, op, cost, allowed, remaining, retry_after, reset_after, wait] = cells;
    let line = format!(
        "{t_ms:>10}  {key:<10}  {op:<13}  {cost:>4}  {allowed:<7}  {remaining:>9}  \
         {retry_after:>14}  {reset_after:>14}  {wait:>9}  {notes}"
    );
    line.trim_end().to_owned()
}

/// The table's header line.
pub fn table_header() -> String {
    columns(
        [
            "t_ms",
            "key",
            "op",
            "cost",
            "allowed",
            "remaining",
            "retry_after_ms",
            "reset_after_ms",
            "wait_ms",
        ],
        "notes",
    )
}

/// One answer as a table line; `limit`: which `--limit` of several
/// answered (1-based), noted first.
pub fn table_row(answer: &Answer, limit: Option<usize>) -> String {
    let noted = |notes: String| match limit {
        Some(limit) if notes.is_empty() => format!("limit {limit}"),
        Some(limit) => format!("limit {limit}; {notes}"),
        None => notes,
    };
    let (t_ms, key, op, cost) = answer.echo.as_ref().map_or(("-", "", "-", "-"), |echo| {
        (
            echo.t_ms.as_str(),
            echo.key.as_str(),
            echo.op.as_str(),
            echo.cost.as_str(),
        )
    });
    let key = if key.is_empty() { "\"\"" } else { key };
    let decided = match &answer.result {
        Ok(decided) => decided,
        Err(message) => {
            return columns(
                [t_ms, key, op, cost, "-", "-", "-", "-", "-"],
                &noted(format!("error: {message}")),
            )
        }
    };
    let decision = &decided.decision;
    let retry_after = decision.retry_after.map_or_else(|| "never".to_owned(), duration);
    columns(
        [
            t_ms,
            key,
            op,
            cost,
            if decision.allowed { "yes" } else { "no" },
            &decision.remaining.to_string(),
            &retry_after,
            &duration(decision.reset_after),
            &duration(decision.wait),
        ],
        &noted(notes(decided)),
    )
}

/// `granted`, `lease`, and which named limits denied.
fn notes(decided: &Decided) -> String {
    let mut notes = Vec::new();
    if let Some(granted) = decided.granted {
        notes.push(format!("granted {granted}"));
    }
    if let Some(lease) = &decided.lease {
        notes.push(format!("lease {lease}"));
    }
    let denying: Vec<&str> = decided
        .limits
        .iter()
        .filter(|(_, decision)| !decision.allowed)
        .map(|(name, _)| name.as_str())
        .collect();
    if !denying.is_empty() {
        notes.push(format!("denied by {}", denying.join(", ")));
    }
    notes.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_exact_milliseconds() {
        assert_eq!(millis(0), "0");
        assert_eq!(millis(100_000), "100");
        assert_eq!(millis(1_500), "1.5");
        assert_eq!(millis(142_858), "142.858");
        assert_eq!(millis(1), "0.001");
        assert_eq!(millis(10), "0.01");
        assert_eq!(millis(u64::MAX), "18446744073709551.615");
    }

    #[test]
    fn errors_are_escaped() {
        let answer = Answer::invalid(None, crate::simulate::StepError::Shape("bad \"step\"\n".to_owned()));
        assert_eq!(json(&answer), r#"{"error":"bad \"step\"\n"}"#);
    }
}
