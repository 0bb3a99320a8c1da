//! One step of a trace: `{"t_ms": 0, "key": "a", "op": "check", "cost": 1}`.
//!
//! Times arrive as JSON numbers in milliseconds. A program computing them in
//! floating point writes `0.30000000000000004` for 0.3 ms, so a time is
//! rounded to the nearest microsecond when it lies within 1e-6 µs of it (or
//! a few units in the last place, for very large times); anything coarser
//! that is not a whole microsecond is refused rather than rounded.

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

/// The latest `t_ms` accepted, in µs (floats hold integers exactly below it).
const MAX_MICROS: u64 = 1 << 53;

/// Why a step does not run: it is answered with `{"error": …}` and the
/// replay goes on.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("the step is not valid UTF-8")]
    NotUtf8,
    #[error("invalid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The step as a whole has the wrong shape (serde's words).
    #[error("{0}")]
    Shape(String),
    /// One field has the wrong shape (serde's words).
    #[error("{path}: {message}")]
    Field { path: String, message: String },
    #[error("{0} is not a number")]
    NotANumber(&'static str),
    #[error("{0} must not be negative")]
    Negative(&'static str),
    #[error("{0} is too large (at most 2^53 us)")]
    TooLarge(&'static str),
    #[error("{field} ({ms}) is finer than a microsecond (0.001 ms)")]
    FinerThanMicrosecond { field: &'static str, ms: f64 },
    #[error("max_wait_ms applies only to reserve and acquire")]
    MaxWaitWithoutWaiting,
    #[error("lease applies only to acquire and release")]
    LeaseWithoutLeasing,
    #[error("release needs a \"lease\" (the one its acquire answered with)")]
    ReleaseWithoutLease,
    #[error("t_ms must not decrease ({t_ms} after {last})")]
    TimeGoesBack { t_ms: String, last: String },
    #[error("t_ms is too large (the simulated time must stay below 2^53 us)")]
    TimePastEnd,
    /// The library refuses the request (a cost the limit never admits, …).
    #[error(transparent)]
    Refused(tollgate::Error),
}

/// A step, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Microseconds since `--start`.
    pub t_us: u64,
    /// The subject.
    pub key: String,
    /// What to do.
    pub op: StepOp,
    /// Units the step weighs (unused by `release` and `reset`).
    pub cost: u64,
}

/// What a step asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOp {
    Check,
    CheckAtMost,
    Reserve {
        max_wait: Option<Duration>,
    },
    /// `lease: None` takes the simulation's next lease name.
    Acquire {
        lease: Option<String>,
        max_wait: Option<Duration>,
    },
    Release {
        lease: String,
    },
    Reset,
    /// Units spent already, counted whether or not they fit.
    Record,
}

/// A step as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename = "step")]
struct Raw {
    t_ms: f64,
    #[serde(default)]
    key: String,
    #[serde(default)]
    op: OpName,
    #[serde(default = "one")]
    cost: u64,
    #[serde(default)]
    max_wait_ms: Option<f64>,
    #[serde(default)]
    lease: Option<String>,
}

fn one() -> u64 {
    1
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
enum OpName {
    #[default]
    Check,
    CheckAtMost,
    Reserve,
    Acquire,
    Release,
    Reset,
    Record,
}

impl Step {
    /// Reads and validates a step; the error names the field at fault.
    pub fn from_value(value: Value) -> Result<Self, StepError> {
        let raw: Raw = serde_path_to_error::deserialize(value).map_err(|error| {
            let path = error.path().to_string();
            let message = error.inner().to_string().replace('`', "\"");
            if path == "." {
                StepError::Shape(message)
            } else {
                StepError::Field { path, message }
            }
        })?;
        let t_us = micros(raw.t_ms, "t_ms")?;
        // A wait past what the clock represents (a Java client's
        // Long.MAX_VALUE) is "as long as it takes": no bound at all.
        let max_wait = raw
            .max_wait_ms
            .filter(|ms| ms.is_nan() || *ms * 1000.0 < MAX_MICROS as f64)
            .map(|ms| micros(ms, "max_wait_ms").map(Duration::from_micros))
            .transpose()?;
        if max_wait.is_some() && !matches!(raw.op, OpName::Reserve | OpName::Acquire) {
            return Err(StepError::MaxWaitWithoutWaiting);
        }
        if raw.lease.is_some() && !matches!(raw.op, OpName::Acquire | OpName::Release) {
            return Err(StepError::LeaseWithoutLeasing);
        }
        let op = match raw.op {
            OpName::Check => StepOp::Check,
            OpName::CheckAtMost => StepOp::CheckAtMost,
            OpName::Reserve => StepOp::Reserve { max_wait },
            OpName::Acquire => StepOp::Acquire {
                lease: raw.lease,
                max_wait,
            },
            OpName::Release => StepOp::Release {
                lease: raw.lease.ok_or(StepError::ReleaseWithoutLease)?,
            },
            OpName::Reset => StepOp::Reset,
            OpName::Record => StepOp::Record,
        };
        Ok(Self {
            t_us,
            key: raw.key,
            op,
            cost: raw.cost,
        })
    }
}

/// Whole microseconds in `ms` milliseconds; see the module docs.
fn micros(ms: f64, field: &'static str) -> Result<u64, StepError> {
    if ms.is_nan() {
        return Err(StepError::NotANumber(field));
    }
    if ms < 0.0 {
        return Err(StepError::Negative(field));
    }
    let us = ms * 1000.0;
    if us >= MAX_MICROS as f64 {
        return Err(StepError::TooLarge(field));
    }
    let whole = us.round();
    let tolerance = 1e-6_f64.max(us * 4.0 * f64::EPSILON);
    if (us - whole).abs() > tolerance {
        return Err(StepError::FinerThanMicrosecond { field, ms });
    }
    Ok(whole as u64)
}

/// The step's columns as written, for the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Echo {
    pub t_ms: String,
    pub key: String,
    pub op: String,
    pub cost: String,
}

impl Echo {
    /// What `value` says, with the defaults filled in.
    pub fn of(value: &Value) -> Self {
        let text = |field: &str, default: &str| match value.get(field) {
            None => default.to_owned(),
            Some(Value::String(text)) => text.clone(),
            Some(other) => other.to_string(),
        };
        let op = text("op", "check");
        let cost_default = if matches!(op.as_str(), "release" | "reset") {
            "-"
        } else {
            "1"
        };
        Self {
            t_ms: text("t_ms", "-"),
            key: text("key", ""),
            cost: text("cost", cost_default),
            op,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn step(value: Value) -> Result<Step, StepError> {
        Step::from_value(value)
    }

    /// What `value` is refused with.
    fn refusal(value: Value) -> String {
        step(value).unwrap_err().to_string()
    }

    fn refused(ms: f64) -> StepError {
        micros(ms, "t_ms").unwrap_err()
    }

    #[test]
    fn defaults_fill_in() {
        let step = step(json!({"t_ms": 5})).unwrap();
        assert_eq!(
            step,
            Step {
                t_us: 5_000,
                key: String::new(),
                op: StepOp::Check,
                cost: 1
            }
        );
    }

    #[test]
    fn times_are_whole_microseconds() {
        assert_eq!(micros(0.001, "t_ms").unwrap(), 1);
        assert_eq!(micros(142.857, "t_ms").unwrap(), 142_857);
        assert_eq!(micros(0.300_000_000_000_000_04, "t_ms").unwrap(), 300);
        assert_eq!(micros(86_400_000.001, "t_ms").unwrap(), 86_400_000_001);
        assert_eq!(micros(1e12 + 0.003, "t_ms").unwrap(), 1_000_000_000_000_003);
        assert_eq!(
            refused(0.0005).to_string(),
            "t_ms (0.0005) is finer than a microsecond (0.001 ms)"
        );
        assert!(matches!(refused(1e9 + 0.0001), StepError::FinerThanMicrosecond { .. }));
        assert!(matches!(refused(-1.0), StepError::Negative("t_ms")));
        assert!(matches!(refused(f64::NAN), StepError::NotANumber("t_ms")));
        assert!(matches!(refused(1e13), StepError::TooLarge("t_ms")));
    }

    #[test]
    fn errors_name_the_field() {
        let message = refusal(json!({"t_ms": 0, "cots": 1}));
        assert!(message.contains("unknown field \"cots\""), "{message}");
        let message = refusal(json!({"t_ms": 0, "cost": "x"}));
        assert!(message.starts_with("cost: "), "{message}");
        let message = refusal(json!({"t_ms": 0, "op": "chek"}));
        assert!(message.starts_with("op: unknown variant \"chek\""), "{message}");
        let message = refusal(json!({"key": "a"}));
        assert!(message.contains("missing field \"t_ms\""), "{message}");
        let message = refusal(json!({"t_ms": 0, "op": "release"}));
        assert!(message.contains("needs a \"lease\""), "{message}");
        let message = refusal(json!({"t_ms": 0, "lease": "1"}));
        assert!(message.contains("lease applies only"), "{message}");
        for huge in [9_007_199_254_740.992, 9_223_372_036_854_775_807.0, f64::MAX] {
            let unbounded = step(json!({"t_ms": 0, "op": "reserve", "max_wait_ms": huge})).unwrap();
            assert_eq!(unbounded.op, StepOp::Reserve { max_wait: None }, "{huge}");
        }
        let message = refusal(json!({"t_ms": 0, "max_wait_ms": 1}));
        assert!(message.contains("max_wait_ms applies only"), "{message}");
    }

    #[test]
    fn echo_keeps_what_was_written() {
        let echo = Echo::of(&json!({"t_ms": 1.5, "key": "a", "op": "reset"}));
        assert_eq!(
            echo,
            Echo {
                t_ms: "1.5".into(),
                key: "a".into(),
                op: "reset".into(),
                cost: "-".into()
            }
        );
    }
}
