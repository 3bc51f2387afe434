//! Users' files and what a job may read.
//!
//! A user uploads a model or dataset as an *artifact* (`PUT
//! /v1/artifacts/{name}`), stored under the user's namespace in the
//! platform's object store, and names it in a spec as `artifact:{name}`.
//! At submit the API resolves each such URL to the artifact's current
//! version ([`ResolvedArtifact`]: its object URL and SHA-256, so a re-upload
//! never changes what a started job reads) and fixes the job's
//! [`DataPolicy`]: the URLs its executors may open. The executor checks every
//! URL against that policy again before it opens anything.
//!
//! The rules (docs/security.md): a user's job reads its owner's artifacts
//! and URLs under prefixes an admin allowed (`--allow-data-url`), never an
//! object of the store itself (checkpoints and weights of any job are
//! reached through `resume_from` and the API); an admin's job reads any URL.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The scheme of a URL naming an artifact of the job's owner.
pub const ARTIFACT_SCHEME: &str = "artifact:";

/// Longest artifact name.
pub const MAX_ARTIFACT_NAME_CHARS: usize = 128;

/// Why `name` is not an artifact name, or `None` where it is one: 1–128
/// characters of `A-Z a-z 0-9 . _ -`, not starting with a dot (no paths, so
/// a name can never reach outside its owner's namespace).
pub fn artifact_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("an artifact name must not be empty".into());
    }
    if name.chars().count() > MAX_ARTIFACT_NAME_CHARS {
        return Some(format!(
            "an artifact name has at most {MAX_ARTIFACT_NAME_CHARS} characters"
        ));
    }
    if name.starts_with('.') {
        return Some("an artifact name must not start with a dot".into());
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Some(format!(
            "an artifact name is letters, digits, '.', '_' and '-' only (found {c:?}); artifacts are named within your own namespace"
        ));
    }
    None
}

/// The artifact name of an `artifact:{name}` URL (`None` for other URLs).
pub fn artifact_of(url: &str) -> Option<&str> {
    url.strip_prefix(ARTIFACT_SCHEME)
}

/// An uploaded file: the current version of one of a user's names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Artifact {
    /// Its name in the owner's namespace.
    pub name: String,
    /// The user it belongs to.
    pub owner: String,
    /// Bytes.
    pub size: u64,
    /// SHA-256 of the bytes (hex).
    pub sha256: String,
    /// When this version was uploaded.
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// What to write in a spec's `model.url` or `dataset.url`: `artifact:{name}`.
    pub url: String,
}

/// A page of artifacts, by owner and name.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ArtifactPage {
    /// The artifacts.
    pub artifacts: Vec<Artifact>,
}

/// One `artifact:` URL of a spec as submit resolved it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ResolvedArtifact {
    /// The spec's field (`model.url`, `dataset.url`).
    pub field: String,
    /// The artifact's name.
    pub name: String,
    /// The object-store URL of the version the job reads.
    pub url: String,
    /// Its SHA-256 (hex): the executor checks the bytes it reads.
    pub sha256: String,
    /// Its size in bytes.
    pub size: u64,
}

/// What a job may read, fixed at submit and sent with every assignment and
/// inspection: the executor refuses any other URL before opening it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
pub struct DataPolicy {
    /// An admin's job: any URL.
    #[serde(default)]
    pub unrestricted: bool,
    /// URL prefixes the job may read (each ends with `/`), the admin's
    /// `--allow-data-url` list at submit time.
    #[serde(default)]
    pub allowed_prefixes: Vec<String>,
    /// Prefixes that no allowed prefix opens: the platform's object store.
    #[serde(default)]
    pub denied_prefixes: Vec<String>,
    /// The exact object URLs of the job's artifacts (inside the denied store).
    #[serde(default)]
    pub artifacts: Vec<ResolvedArtifact>,
}

impl DataPolicy {
    /// A policy that lets an admin's job read anything.
    pub fn unrestricted() -> DataPolicy {
        DataPolicy {
            unrestricted: true,
            ..DataPolicy::default()
        }
    }

    /// The resolved artifact of `url`, when it is one of the job's.
    pub fn artifact(&self, url: &str) -> Option<&ResolvedArtifact> {
        self.artifacts.iter().find(|a| a.url == url)
    }

    /// Why the job may not read `url` (`None`: it may).
    ///
    /// Prefixes match whole path segments, and a URL with `.`/`..`
    /// segments, an empty segment or a percent-escape is refused outright:
    /// each could name a place outside the prefix it starts with.
    pub fn refusal(&self, url: &str) -> Option<String> {
        if self.unrestricted || self.artifact(url).is_some() {
            return None;
        }
        if artifact_of(url).is_some() {
            return Some("an artifact: URL the API did not resolve for this job".into());
        }
        if let Some(why) = unsafe_url(url) {
            return Some(why);
        }
        if self.denied_prefixes.iter().any(|p| under_prefix(url, p)) {
            return Some(
                "it is inside the platform's own storage (its object store or data folder), which jobs cannot read: name your own upload as artifact:NAME, or resume from a job with resume_from".into(),
            );
        }
        if self.allowed_prefixes.iter().any(|p| under_prefix(url, p)) {
            return None;
        }
        Some(if self.allowed_prefixes.is_empty() {
            "a job may read only its owner's artifacts (artifact:NAME; upload with PUT /v1/artifacts/NAME): no other data URL is allowed on this platform".into()
        } else {
            format!(
                "a job may read only its owner's artifacts (artifact:NAME) and URLs under the prefixes an admin allowed: {}",
                self.allowed_prefixes.join(", ")
            )
        })
    }
}

/// `prefix` with exactly one trailing `/`, so that it matches whole segments.
pub fn normalize_prefix(prefix: &str) -> String {
    format!("{}/", prefix.trim_end_matches('/'))
}

/// Every spelling of a store prefix a job's URL could use for the same
/// objects: as given, and with `s3a://` (which the store opens as S3)
/// written `s3://`, the only S3 scheme specs accept.
pub fn prefix_spellings(prefix: &str) -> Vec<String> {
    let p = normalize_prefix(prefix);
    let mut out = vec![p.clone()];
    if let Some(rest) = p.strip_prefix("s3a://") {
        out.push(format!("s3://{rest}"));
    }
    out
}

/// Whether `url` lies under `prefix` (compared as whole segments).
fn under_prefix(url: &str, prefix: &str) -> bool {
    let p = normalize_prefix(prefix);
    url.starts_with(&p) || url == p.trim_end_matches('/')
}

/// Why a URL's path could escape the prefix it starts with.
fn unsafe_url(url: &str) -> Option<String> {
    let Some((_, rest)) = url.split_once("://") else {
        return Some("not a URL".into());
    };
    if url.contains('%') {
        return Some("percent-escapes are not accepted in a data URL".into());
    }
    if url.contains('\\') {
        return Some("backslashes are not accepted in a data URL".into());
    }
    if url.contains('?') || url.contains('#') {
        return Some("a data URL has no query or fragment".into());
    }
    // `file:///a/b`: rest is `/a/b`, the empty first segment is the root.
    let path = rest.strip_prefix('/').unwrap_or(rest);
    if path
        .split('/')
        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return Some("a data URL has no empty, '.' or '..' path segments".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn user_policy() -> DataPolicy {
        DataPolicy {
            unrestricted: false,
            allowed_prefixes: vec!["s3://datasets/".into(), "file:///srv/data/".into()],
            denied_prefixes: vec!["s3://trainyard/objects/".into()],
            artifacts: vec![ResolvedArtifact {
                field: "model.url".into(),
                name: "m.pt".into(),
                url: "s3://trainyard/objects/artifacts/alice/0190/m.pt".into(),
                sha256: "00".into(),
                size: 1,
            }],
        }
    }

    #[test]
    fn names_are_single_segments() {
        for ok in ["model.pt", "digits.npz", "a-b_c.9", "X"] {
            assert_eq!(artifact_name_problem(ok), None, "{ok}");
        }
        for bad in [
            "", ".hidden", "..", "a/b", "../x", "a b", "é.pt", "a\\b", "a%2fb",
        ] {
            assert!(artifact_name_problem(bad).is_some(), "{bad}");
        }
        assert!(artifact_name_problem(&"a".repeat(129)).is_some());
        assert_eq!(artifact_name_problem(&"a".repeat(128)), None);
    }

    #[test]
    fn a_users_job_reads_its_artifacts_and_allowed_prefixes_only() {
        let p = user_policy();
        assert_eq!(
            p.refusal("s3://trainyard/objects/artifacts/alice/0190/m.pt"),
            None
        );
        assert_eq!(p.refusal("s3://datasets/mnist/train.npz"), None);
        assert_eq!(p.refusal("file:///srv/data/x.npz"), None);
        for bad in [
            "file:///etc/passwd",
            "file:///srv/data-private/x.npz",
            "file:///srv/data/../../etc/passwd",
            "file:///srv/data//x.npz",
            "file:///srv/data/%2e%2e/x",
            "s3://datasets-other/x.npz",
            "s3://trainyard/objects/0190-job/final/model.safetensors",
            "s3://trainyard/objects/artifacts/bob/0191/m.pt",
            "artifact:m.pt",
        ] {
            assert!(p.refusal(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn the_store_stays_closed_under_an_allowed_prefix_that_covers_it() {
        let mut p = user_policy();
        p.allowed_prefixes.push("s3://trainyard/".into());
        let why = p
            .refusal("s3://trainyard/objects/0190/final/model.safetensors")
            .unwrap();
        assert!(why.contains("object store or data folder"), "{why}");
        assert_eq!(p.refusal("s3://trainyard/public/x.npz"), None);
    }

    #[test]
    fn an_s3a_store_is_closed_under_its_s3_spelling() {
        assert_eq!(
            prefix_spellings("s3a://b/objects"),
            ["s3a://b/objects/", "s3://b/objects/"]
        );
        assert_eq!(prefix_spellings("file:///x/"), ["file:///x/"]);
    }

    #[test]
    fn an_admins_job_reads_anything() {
        let p = DataPolicy::unrestricted();
        assert_eq!(p.refusal("file:///etc/passwd"), None);
    }

    proptest! {
        /// Whatever a stranger writes after an allowed prefix, a URL that is
        /// accepted never names a place outside it once its path is
        /// resolved the way a filesystem would.
        #[test]
        fn an_accepted_url_resolves_under_its_prefix(
            segs in proptest::collection::vec(
                prop_oneof![
                    Just("..".to_owned()), Just(".".to_owned()), Just("".to_owned()),
                    Just("%2e%2e".to_owned()), "[a-z0-9._-]{1,6}",
                ],
                1..6,
            )
        ) {
            let p = user_policy();
            let url = format!("file:///srv/data/{}", segs.join("/"));
            if p.refusal(&url).is_none() {
                let mut stack: Vec<&str> = vec!["srv", "data"];
                for s in url["file:///".len()..].split('/').skip(2) {
                    match s {
                        ".." => { stack.pop(); }
                        "." | "" => {}
                        s => stack.push(s),
                    }
                }
                prop_assert!(stack.len() > 2 && stack[..2] == ["srv", "data"], "{url}");
            }
        }
    }
}
