//! Where `serve` sends alerts: `--alert-webhook` (or its variable), and the
//! private CA an `https://` webhook may chain to.

use std::path::PathBuf;

use super::Args;
use crate::UsageError;

/// The webhook alerts go to: `--alert-webhook`, else `TOLLGATE_ALERT_WEBHOOK`.
pub(super) fn alert_webhook(args: &Args) -> Result<Option<String>, UsageError> {
    if let Some(url) = &args.alert_webhook {
        return Ok(Some(url.clone()));
    }
    match std::env::var(ALERT_WEBHOOK_ENV) {
        Ok(url) if !url.trim().is_empty() => crate::arg::webhook_url(url.trim())
            .map(Some)
            .map_err(|error| UsageError(format!("{ALERT_WEBHOOK_ENV}: {error}"))),
        _ => Ok(None),
    }
}

/// The environment variable naming the alert webhook.
pub const ALERT_WEBHOOK_ENV: &str = "TOLLGATE_ALERT_WEBHOOK";

/// The environment variable naming the alert webhook's CA file.
pub const ALERT_WEBHOOK_CA_ENV: &str = "TOLLGATE_ALERT_WEBHOOK_CA";

/// The certificates of `--alert-webhook-ca` (else its variable's file).
pub(super) fn alert_webhook_roots(args: &Args) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, UsageError> {
    let (path, source) = match (&args.alert_webhook_ca, std::env::var_os(ALERT_WEBHOOK_CA_ENV)) {
        (Some(path), _) => (path.clone(), "--alert-webhook-ca"),
        (None, Some(path)) if !path.is_empty() => (PathBuf::from(path), ALERT_WEBHOOK_CA_ENV),
        _ => return Ok(Vec::new()),
    };
    let roots =
        tollgate_server::tls::ca_certificates(&path).map_err(|error| UsageError(format!("{source}: {error}")))?;
    // A certificate rustls cannot take as a root is refused now, not at the
    // first alert.
    tollgate_server::service::WebhookClient::new(&roots)
        .map_err(|error| UsageError(format!("{source} {}: {error}", path.display())))?;
    Ok(roots)
}
