//! The command line's own value parsers, and what each refuses.
//!
//! clap calls these for one option's text and prints the error after the
//! option's name (exit code 2); the error says what the text should be.

use std::str::FromStr;
use std::time::Duration;

use tollgate::OnStoreError;
use tollgate_server::service::REFUSALS_SAMPLED_OF;

/// An option's value the command cannot take.
#[derive(Debug, thiserror::Error)]
pub enum ArgError {
    /// Not a number from 0 to 1.
    #[error("\"{0}\": a share from 0 to 1 (0.01: one refusal in a hundred)")]
    Share(String),
    /// Not a URL at all.
    #[error("\"{text}\" is not a URL: {source}")]
    Url {
        text: String,
        source: <reqwest::Url as FromStr>::Err,
    },
    /// A URL, but not one a webhook can be sent to.
    #[error("\"{0}\": expected an http:// or https:// URL with a host")]
    NotHttp(String),
    /// A policy the library refuses, in its words.
    #[error(transparent)]
    Invalid(#[from] tollgate::Error),
    /// Not a duration, in the library's words.
    #[error(transparent)]
    Duration(#[from] tollgate::duration::DurationError),
    /// A duration of zero where something must happen after one.
    #[error("the duration must be more than zero")]
    ZeroDuration,
    /// An entry without `=`.
    #[error("\"{0}\": an entry is key=value")]
    NotAnEntry(String),
    /// An entry `=value`.
    #[error("\"{0}\": the key must not be empty")]
    EmptyKey(String),
}

/// `--on-store-error`: `error`, `open`, `closed` or `local`.
pub fn on_store_error(text: &str) -> Result<OnStoreError, ArgError> {
    Ok(text.parse()?)
}

/// A duration more than zero (`250ms`, `1s`, `5m`).
pub fn duration(text: &str) -> Result<Duration, ArgError> {
    let duration = tollgate::duration::parse_duration(text)?;
    if duration.is_zero() {
        return Err(ArgError::ZeroDuration);
    }
    Ok(duration)
}

/// `--log-refusals`: a share from 0 to 1, in millionths.
pub fn refusal_rate(text: &str) -> Result<u32, ArgError> {
    let rate: f64 = text
        .parse()
        .ok()
        .filter(|rate: &f64| (0.0..=1.0).contains(rate))
        .ok_or_else(|| ArgError::Share(text.to_owned()))?;
    let scale = f64::from(REFUSALS_SAMPLED_OF);
    // In range by the filter above.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok((rate * scale).round() as u32)
}

/// An `http://` or `https://` URL with a host.
pub fn webhook_url(text: &str) -> Result<String, ArgError> {
    let parsed = reqwest::Url::parse(text).map_err(|source| ArgError::Url {
        text: text.to_owned(),
        source,
    })?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(ArgError::NotHttp(text.to_owned()));
    }
    Ok(text.to_owned())
}

/// `key=value`, as `--entry` takes it.
pub fn entry(text: &str) -> Result<(String, String), ArgError> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| ArgError::NotAnEntry(text.to_owned()))?;
    if key.is_empty() {
        return Err(ArgError::EmptyKey(text.to_owned()));
    }
    Ok((key.to_owned(), value.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_says_what_the_value_should_be() {
        assert!(matches!(duration("0s"), Err(ArgError::ZeroDuration)));
        assert!(matches!(duration("soon"), Err(ArgError::Duration(_))));
        assert_eq!(duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(matches!(on_store_error("maybe"), Err(ArgError::Invalid(_))));
        assert_eq!(refusal_rate("0.01").unwrap(), REFUSALS_SAMPLED_OF / 100);
        assert!(matches!(refusal_rate("1.5"), Err(ArgError::Share(_))));
        assert!(matches!(webhook_url("not a url"), Err(ArgError::Url { .. })));
        assert!(matches!(webhook_url("ftp://127.0.0.1/"), Err(ArgError::NotHttp(_))));
        assert_eq!(
            webhook_url("http://127.0.0.1:9/hook").unwrap(),
            "http://127.0.0.1:9/hook"
        );
        assert_eq!(entry("user=ann=b").unwrap(), ("user".to_owned(), "ann=b".to_owned()));
        assert!(matches!(entry("user"), Err(ArgError::NotAnEntry(_))));
        assert_eq!(
            entry("=x").unwrap_err().to_string(),
            "\"=x\": the key must not be empty"
        );
    }
}
