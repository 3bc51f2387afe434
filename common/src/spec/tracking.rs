//! A job's `tracking`: the experiment trackers its params, metrics and
//! model are logged to, by the API server in the background (the API's
//! `tracking` module exports; the job never waits on a tracker).
//!
//! Here are the wire types and the checks of their form, which need no
//! server setting: an MLflow URL is `http` or `https`, names a host, and
//! carries no credentials, query or fragment; an experiment name is
//! bounded and printable. Which URLs a user may name at all (the server's
//! default, or one under an operator's allowed prefixes) is the API's
//! rule, at submit.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Longest MLflow experiment name (MLflow's own bound is 500).
pub const MAX_EXPERIMENT_CHARS: usize = 250;
/// Longest tracking server URL.
pub const MAX_TRACKING_URI_CHARS: usize = 1024;

/// Experiment trackers the job is logged to. An unreachable tracker never
/// slows or fails the job: the job gets a `tracking` warning event and the
/// export catches up when the tracker answers again.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Tracking {
    /// Log to an MLflow tracking server: one run per job, with the spec
    /// flattened as params, every step metric of rank 0, tags (job id,
    /// owner, pattern, generation), the final model as an artifact, and a
    /// status (`FINISHED`, `FAILED`, `KILLED`) when the job ends. When the
    /// server has a default (`--mlflow-uri`), jobs are logged there unless
    /// they say `enabled: false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlflow: Option<MlflowTracking>,
}

/// Where and whether a job's MLflow run is logged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MlflowTracking {
    /// `false` keeps the job out of MLflow even where the server has a
    /// default (default `true`).
    #[serde(default = "enabled", skip_serializing_if = "is_enabled")]
    pub enabled: bool,
    /// The tracking server's base URL (`http://` or `https://`, no
    /// credentials, query or fragment); default: the server's
    /// `--mlflow-uri`. A user may name only the server's default or a URL
    /// under one of its `--tracking-allowed-uri` prefixes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "http://mlflow.internal:5000")]
    pub uri: Option<String>,
    /// The experiment (1–250 characters, no control characters), made when
    /// missing; default: the server's `--mlflow-experiment`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experiment: Option<String>,
}

fn enabled() -> bool {
    true
}

fn is_enabled(b: &bool) -> bool {
    *b
}

/// What is wrong with `uri` as a tracking server's URL, if anything.
pub fn tracking_uri_problem(uri: &str) -> Option<String> {
    if uri.chars().count() > MAX_TRACKING_URI_CHARS {
        return Some(format!(
            "must be at most {MAX_TRACKING_URI_CHARS} characters"
        ));
    }
    if uri.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Some("must not contain whitespace or control characters".into());
    }
    let Some(rest) = uri
        .strip_prefix("http://")
        .or_else(|| uri.strip_prefix("https://"))
    else {
        return Some("must be an http:// or https:// URL".into());
    };
    if uri.contains(['?', '#', '\\']) {
        return Some("must not have a query, a fragment or a backslash".into());
    }
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.contains('@') {
        return Some("must not carry credentials (user@host)".into());
    }
    if authority.is_empty() || authority.starts_with(':') {
        return Some("must name a host".into());
    }
    None
}

/// What is wrong with `name` as an MLflow experiment's name, if anything.
pub fn experiment_problem(name: &str) -> Option<String> {
    let n = name.chars().count();
    if name.trim().is_empty() {
        return Some("must not be empty".into());
    }
    if n > MAX_EXPERIMENT_CHARS {
        return Some(format!(
            "must be at most {MAX_EXPERIMENT_CHARS} characters, got {n}"
        ));
    }
    if name.chars().any(char::is_control) {
        return Some("must not contain control characters".into());
    }
    None
}

/// Every violation of `tracking`'s form, as (field, message).
pub(super) fn check(t: &Tracking, fail: &mut impl FnMut(&str, String)) {
    if let Some(m) = &t.mlflow {
        if let Some(why) = m.uri.as_deref().and_then(tracking_uri_problem) {
            fail("tracking.mlflow.uri", why);
        }
        if let Some(why) = m.experiment.as_deref().and_then(experiment_problem) {
            fail("tracking.mlflow.experiment", why);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_uris_pass() {
        for u in [
            "http://127.0.0.1:5000",
            "https://mlflow.example.com/",
            "http://mlflow:5000/prefix",
        ] {
            assert_eq!(tracking_uri_problem(u), None, "{u}");
        }
    }

    #[test]
    fn hostile_uris_are_named() {
        for (u, what) in [
            ("file:///etc/passwd", "http"),
            ("gopher://127.0.0.1:70/", "http"),
            ("HTTP://x", "http"),
            ("http://user:pw@127.0.0.1:5000", "credentials"),
            ("http://127.0.0.1:5000@evil.example", "credentials"),
            ("http://", "host"),
            ("http://:5000/", "host"),
            ("http://x/?a=1", "query"),
            ("http://x/#f", "fragment"),
            ("http://x\\@y/", "query"),
            ("http://x y/", "whitespace"),
        ] {
            let why = tracking_uri_problem(u).unwrap_or_else(|| panic!("{u} passed"));
            assert!(why.contains(what), "{u}: {why}");
        }
        let long = format!("http://x/{}", "a".repeat(MAX_TRACKING_URI_CHARS));
        assert!(tracking_uri_problem(&long).unwrap().contains("at most"));
    }

    #[test]
    fn experiment_names_are_bounded_and_printable() {
        assert_eq!(experiment_problem("digits sweep/1"), None);
        assert!(experiment_problem("  ").is_some());
        assert!(experiment_problem("a\u{7}b").is_some());
        assert!(experiment_problem(&"x".repeat(MAX_EXPERIMENT_CHARS + 1)).is_some());
        assert_eq!(experiment_problem(&"é".repeat(MAX_EXPERIMENT_CHARS)), None);
    }
}
