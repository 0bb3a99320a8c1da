//! A running server's API behind a token (`/v1/overrides`, `/v1/usage`):
//! where it is, the token (a file, or an environment variable), one call
//! and its answer or its refusal.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args as ClapArgs;
use serde_json::{json, Value};

use crate::UsageError;

/// Where the server is, and the token that opens its API.
#[derive(Debug, ClapArgs)]
pub struct Target {
    /// The server's HTTP address.
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:8080")]
    pub server: String,
    /// A file holding the token (else the environment's, see the command).
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
}

/// Entries as the API writes a descriptor: `[{"key": …, "value": …}, …]`.
pub fn descriptor(entries: &[(String, String)]) -> Value {
    entries
        .iter()
        .map(|(key, value)| json!({ "key": key, "value": value }))
        .collect()
}

impl Target {
    /// `--token-file`'s token, else the first of `envs` set.
    fn token(&self, envs: &[&str]) -> anyhow::Result<String> {
        let token = match &self.token_file {
            Some(path) => std::fs::read_to_string(path)
                .with_context(|| format!("--token-file: cannot read {}", path.display()))?,
            None => envs
                .iter()
                .find_map(|env| std::env::var(env).ok().filter(|token| !token.trim().is_empty()))
                .unwrap_or_default(),
        };
        let token = token.trim().to_owned();
        if token.is_empty() {
            return Err(UsageError(format!("a token is required: --token-file, or {}", envs.join(" or "))).into());
        }
        Ok(token)
    }

    /// Calls `method path?query` with `body`, carrying the token (from
    /// `--token-file`, else the first of `envs` set): the answer.
    ///
    /// # Errors
    ///
    /// No token, a server that cannot be reached, or its refusal (its
    /// message; a 400 is a [`UsageError`]).
    pub fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
        envs: &[&str],
    ) -> anyhow::Result<Value> {
        let token = self.token(envs)?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let (status, answer) = runtime.block_on(async {
            let base = format!("{}{path}", self.server.trim_end_matches('/'));
            let mut url = reqwest::Url::parse(&base).map_err(|error| UsageError(format!("--server: {error}")))?;
            if !query.is_empty() {
                url.query_pairs_mut().extend_pairs(query);
            }
            let mut request = reqwest::Client::new().request(method, url).bearer_auth(token);
            if let Some(body) = body {
                request = request.json(body);
            }
            let response = request
                .send()
                .await
                .with_context(|| format!("cannot reach {}", self.server))?;
            let status = response.status();
            let answer: Value = response.json().await.unwrap_or(Value::Null);
            anyhow::Ok((status, answer))
        })?;
        if !status.is_success() {
            let message = answer
                .get("error")
                .and_then(Value::as_str)
                .map_or_else(|| status.to_string(), str::to_owned);
            let error = anyhow::anyhow!("{message} ({status})");
            return Err(if status.as_u16() == 400 {
                UsageError(error.to_string()).into()
            } else {
                error
            });
        }
        Ok(answer)
    }
}
