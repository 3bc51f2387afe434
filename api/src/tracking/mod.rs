//! Experiment tracking: jobs logged to an MLflow tracking server.
//!
//! At submit, [`target_at_submit`] resolves where a job is logged (its
//! spec's `tracking.mlflow`, else the server's `--mlflow-uri`) and applies
//! the rule against server-side request forgery: the URL is user-named, so
//! a user's job may name only the server's default or a URL under an
//! operator's `--tracking-allowed-uri` prefix (compared parsed: scheme,
//! host, port and whole path segments), else a 422 naming
//! `tracking.mlflow.uri`; admins' jobs name any http(s) URL. [`record`]
//! writes the job's row of `tracking_exports` in the submit's transaction.
//!
//! From then on the exporter ([`export`], one task per API server, stopped
//! by the server's [`Shutdown`](trainyard_shutdown::Shutdown)) follows the
//! job's stored metrics and sends them, never in the job's way: training
//! only writes `job_metrics` as always, and a tracker that is slow or
//! away costs the exporter's own retries with backoff and one `tracking`
//! warning event, nothing else. [`mlflow`] is the REST client and
//! [`params`] turns a spec into MLflow params.

pub mod export;
pub mod mlflow;
pub mod params;

use crate::error::{ApiError, ApiResult};
use crate::Config;
use sqlx::PgConnection;
use trainyard_common::JobSpec;
use url::Url;
use uuid::Uuid;

/// Where a job is logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The tracking server's base URL, as parsed and checked (no trailing
    /// `/`).
    pub uri: String,
    /// The experiment.
    pub experiment: String,
}

const FIELD: &str = "tracking.mlflow.uri";

/// Where `spec` is logged, if anywhere; a 422 naming the field when the
/// spec names a server this caller may not, or asks for MLflow on a server
/// without a default and names none.
pub fn target_at_submit(
    config: &Config,
    is_admin: bool,
    spec: &JobSpec,
) -> ApiResult<Option<Target>> {
    let named = spec.tracking.as_ref().and_then(|t| t.mlflow.as_ref());
    if named.is_some_and(|m| !m.enabled) {
        return Ok(None);
    }
    let experiment = named
        .and_then(|m| m.experiment.clone())
        .unwrap_or_else(|| config.mlflow_experiment.clone());
    let uri = match (named.and_then(|m| m.uri.as_deref()), &config.mlflow_uri) {
        (Some(u), _) => u,
        (None, Some(default)) => default.as_str(),
        (None, None) if named.is_some() => {
            return Err(ApiError::invalid_field(
                FIELD,
                "this server has no default MLflow server (--mlflow-uri): name one",
            ))
        }
        (None, None) => return Ok(None),
    };
    let parsed =
        Url::parse(uri).map_err(|e| ApiError::invalid_field(FIELD, format!("not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(ApiError::invalid_field(
            FIELD,
            "must be an http:// or https:// URL with a host",
        ));
    }
    if !is_admin && !admitted(&parsed, config) {
        let mut allowed: Vec<&str> = config.mlflow_uri.iter().map(String::as_str).collect();
        allowed.extend(config.tracking_allowed_uris.iter().map(String::as_str));
        return Err(ApiError::invalid_field(
            FIELD,
            if allowed.is_empty() {
                format!("{uri} is not a tracking server this server logs to: it admits none (an operator sets --mlflow-uri or --tracking-allowed-uri)")
            } else {
                format!(
                    "{uri} is not a tracking server this server logs to; it admits {}",
                    allowed.join(", ")
                )
            },
        ));
    }
    Ok(Some(Target {
        uri: parsed.as_str().trim_end_matches('/').to_owned(),
        experiment,
    }))
}

/// Whether a user's job may log to `uri`: it is the server's default or
/// under one of the allowed prefixes.
pub fn admitted(uri: &Url, config: &Config) -> bool {
    config
        .mlflow_uri
        .iter()
        .chain(&config.tracking_allowed_uris)
        .any(|prefix| under(uri, prefix))
}

/// Whether `uri` is `prefix` or below it: the same scheme, host and port,
/// no credentials, and `prefix`'s path segments first among its own.
pub fn under(uri: &Url, prefix: &str) -> bool {
    let Ok(p) = Url::parse(prefix) else {
        return false;
    };
    let segments = |u: &Url| -> Vec<String> {
        u.path()
            .split('/')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let (mine, theirs) = (segments(uri), segments(&p));
    uri.scheme() == p.scheme()
        && uri.host_str().is_some()
        && uri.host_str() == p.host_str()
        && uri.port_or_known_default() == p.port_or_known_default()
        && uri.username().is_empty()
        && uri.password().is_none()
        && mine.len() >= theirs.len()
        && mine[..theirs.len()] == theirs[..]
}

/// Writes job `job`'s export row (in the submit's transaction).
pub async fn record(tx: &mut PgConnection, job: Uuid, t: &Target) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO tracking_exports (job_id, uri, experiment) VALUES ($1, $2, $3)
         ON CONFLICT (job_id) DO NOTHING",
    )
    .bind(job)
    .bind(&t.uri)
    .bind(&t.experiment)
    .execute(tx)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn a_prefix_admits_what_is_below_it_and_nothing_else() {
        let p = "http://mlflow.internal:5000/team/";
        assert!(under(&url("http://mlflow.internal:5000/team"), p));
        assert!(under(&url("http://mlflow.internal:5000/team/a"), p));
        assert!(under(&url("http://MLFLOW.internal:5000/team/"), p));
        for bad in [
            "http://mlflow.internal:5000/teamwork",
            "http://mlflow.internal:5000/",
            "http://mlflow.internal:5001/team",
            "https://mlflow.internal:5000/team",
            "http://mlflow.internal.evil.example:5000/team",
            "http://mlflow.internal:5000@evil.example/team",
            "http://user@mlflow.internal:5000/team",
            "http://mlflow.internal:5000/team/../admin",
            "http://mlflow.internal:5000/other/../teamx",
        ] {
            assert!(!under(&url(bad), p), "{bad}");
        }
        // The default port is the same port, however written.
        assert!(under(&url("http://h:80/x"), "http://h/"));
        // An address written another way is the same address.
        assert!(under(
            &url("http://2130706433:5000/"),
            "http://127.0.0.1:5000"
        ));
        assert!(!under(
            &url("http://127.0.0.2:5000/"),
            "http://127.0.0.1:5000"
        ));
    }
}
