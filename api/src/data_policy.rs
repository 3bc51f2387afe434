//! What a job may read: its spec's `artifact:` URLs resolved at submit to
//! the owner's current versions, and the [`DataPolicy`] fixed with them
//! (docs/security.md). The submit handler calls [`policy_at_submit`]; the
//! heartbeat hands [`for_executor`]'s policy and rewritten spec to the
//! executors, which check every URL against it again before opening it.

use crate::error::{ApiError, ApiResult};
use crate::AppState;
use sqlx::Row;
use trainyard_common::artifact::{artifact_of, DataPolicy, ResolvedArtifact};
use trainyard_common::spec::script::Requirements;
use trainyard_common::spec::{DatasetSpec, ModelSpec};
use trainyard_common::{JobSpec, UncheckedJobSpec, Violation};
use uuid::Uuid;

/// The store key of an artifact version's bytes.
pub fn artifact_key(owner: &str, version: Uuid, name: &str) -> String {
    format!("artifacts/{owner}/{version}/{name}")
}

/// The URL fields of a spec a job reads from: `(field, url)`.
pub fn data_urls(spec: &UncheckedJobSpec) -> Vec<(String, &str)> {
    let mut out = Vec::new();
    if let Some(ModelSpec::Torchscript(t)) = &spec.model {
        out.push(("model.url".into(), t.url.as_str()));
    }
    if let Some(DatasetSpec::File(f)) = &spec.dataset {
        out.push(("dataset.url".into(), f.url.as_str()));
        if let Some(u) = &f.eval_url {
            out.push(("dataset.eval_url".into(), u.as_str()));
        }
    }
    if let Some(s) = &spec.script {
        out.push(("script.code".into(), s.code.as_str()));
        if let Some(Requirements::File(u)) = &s.requirements {
            out.push(("script.requirements".into(), u.as_str()));
        }
    }
    for (i, u) in spec.inputs.iter().enumerate() {
        out.push((format!("inputs[{i}]"), u.as_str()));
    }
    out
}

/// The prefixes no job of a user reads: the object store (checkpoints,
/// weights, other users' artifacts) and the server's data folder (its join
/// token, its private Postgres), each in every spelling that reaches it —
/// a folder both as given and with its links resolved (an allowed prefix
/// may name the same place through another path), a store also as `s3://`
/// when it was given as `s3a://`.
fn denied_prefixes(st: &AppState) -> Vec<String> {
    let mut out = Vec::new();
    let mut add = |url: String| {
        for p in trainyard_common::artifact::prefix_spellings(&url) {
            if !out.contains(&p) {
                out.push(p);
            }
        }
    };
    let store = st.store.url().to_owned();
    add(store.clone());
    if let Some(dir) = store.strip_prefix("file://") {
        if let Ok(real) = std::fs::canonicalize(dir) {
            add(format!("file://{}", real.display()));
        }
    }
    let data =
        std::path::absolute(&st.config.data_dir).unwrap_or_else(|_| st.config.data_dir.clone());
    add(format!("file://{}", data.display()));
    if let Ok(real) = std::fs::canonicalize(&data) {
        add(format!("file://{}", real.display()));
    }
    out
}

/// The policy of a user's job before its artifacts are added.
fn user_policy(st: &AppState) -> DataPolicy {
    DataPolicy {
        unrestricted: false,
        allowed_prefixes: st.config.allow_data_urls.clone(),
        denied_prefixes: denied_prefixes(st),
        artifacts: Vec::new(),
    }
}

/// The data policy of a job `owner` submits with `spec`, and the artifact
/// versions it reads; a 422 naming each field whose URL the owner may not
/// read, or whose artifact does not exist. An admin's job reads any URL
/// (its `artifact:` names are still the admin's own).
pub async fn policy_at_submit(
    st: &AppState,
    owner: &str,
    admin: bool,
    spec: &JobSpec,
) -> ApiResult<(DataPolicy, Vec<Uuid>)> {
    let mut policy = if admin {
        DataPolicy::unrestricted()
    } else {
        user_policy(st)
    };
    let mut versions = Vec::new();
    let mut errors = Vec::new();
    for (field, url) in data_urls(spec) {
        if let Some(pattern) = artifact_of(url).filter(|n| n.contains('*')) {
            // A glob over the owner's artifacts: every match is one shard,
            // resolved now like a single artifact.
            let rows = sqlx::query(
                "SELECT a.name, v.id, v.size, v.sha256, v.key FROM artifacts a
                 JOIN artifact_versions v ON v.id = a.version
                 WHERE a.owner = $1 ORDER BY a.name",
            )
            .bind(owner)
            .fetch_all(&st.db)
            .await?;
            let mut matched = 0;
            for row in rows {
                let name: String = row.try_get("name")?;
                if !trainyard_common::spec::glob_matches(pattern, &name) {
                    continue;
                }
                matched += 1;
                let key: String = row.try_get("key")?;
                versions.push(row.try_get("id")?);
                policy.artifacts.push(ResolvedArtifact {
                    field: field.clone(),
                    name,
                    url: st.store.url_of(&key),
                    sha256: row.try_get("sha256")?,
                    size: row.try_get::<i64, _>("size")? as u64,
                });
            }
            if matched == 0 {
                errors.push(Violation {
                    field: field.clone(),
                    message: format!("none of your artifacts matches {pattern:?}"),
                });
            }
            continue;
        }
        if let Some(name) = artifact_of(url) {
            let row = sqlx::query(
                "SELECT v.id, v.size, v.sha256, v.key FROM artifacts a
                 JOIN artifact_versions v ON v.id = a.version
                 WHERE a.owner = $1 AND a.name = $2",
            )
            .bind(owner)
            .bind(name)
            .fetch_optional(&st.db)
            .await?;
            let Some(row) = row else {
                errors.push(Violation {
                    field: field.clone(),
                    message: format!(
                        "you have no artifact named {name:?} (artifacts are per user: upload it with PUT /v1/artifacts/{name})"
                    ),
                });
                continue;
            };
            let key: String = row.try_get("key")?;
            versions.push(row.try_get("id")?);
            policy.artifacts.push(ResolvedArtifact {
                field: field.clone(),
                name: name.into(),
                url: st.store.url_of(&key),
                sha256: row.try_get("sha256")?,
                size: row.try_get::<i64, _>("size")? as u64,
            });
        } else if let Some(why) = policy.refusal(url) {
            errors.push(Violation {
                field,
                message: format!("{url} may not be read by this job: {why}"),
            });
        }
    }
    if !errors.is_empty() {
        return Err(ApiError::Unprocessable(errors));
    }
    Ok((policy, versions))
}

/// The spec and policy an executor receives for a job: every `artifact:`
/// URL replaced by its version's object URL, and the result checked again
/// (an executor is never handed a spec that does not pass). A job stored
/// without a policy (submitted before artifacts existed) reads as an
/// admin's when the bootstrap admin owns it, else under today's user rules.
pub fn for_executor(
    st: &AppState,
    owner: &str,
    stored: Option<serde_json::Value>,
    spec: JobSpec,
) -> Result<(JobSpec, DataPolicy), trainyard_common::spec::InvalidSpec> {
    let mut spec = UncheckedJobSpec::from(spec);
    let policy = match stored.map(serde_json::from_value::<DataPolicy>) {
        Some(Ok(p)) => p,
        Some(Err(e)) => {
            tracing::warn!(error = %e, "a job's stored data policy does not decode; it may read nothing");
            DataPolicy::default()
        }
        None if owner == crate::auth::BOOTSTRAP_USER => DataPolicy::unrestricted(),
        None => user_policy(st),
    };
    let resolve = |field: &str, url: &mut String| {
        // A glob stays one: the executor lists it from the policy's
        // resolved artifacts.
        if trainyard_common::spec::is_glob(url) {
            return;
        }
        if let Some(a) = policy.artifacts.iter().find(|a| a.field == field) {
            *url = a.url.clone();
        }
    };
    if let Some(ModelSpec::Torchscript(t)) = &mut spec.model {
        resolve("model.url", &mut t.url);
    }
    if let Some(s) = &mut spec.script {
        resolve("script.code", &mut s.code);
        if let Some(Requirements::File(u)) = &mut s.requirements {
            resolve("script.requirements", u);
        }
    }
    for (i, u) in spec.inputs.iter_mut().enumerate() {
        resolve(&format!("inputs[{i}]"), u);
    }
    if let Some(DatasetSpec::File(f)) = &mut spec.dataset {
        resolve("dataset.url", &mut f.url);
        if let Some(u) = f.eval_url.as_mut() {
            resolve("dataset.eval_url", u);
        }
    }
    Ok((JobSpec::try_from(spec)?, policy))
}

/// Deletes artifact versions that are superseded (replaced or deleted)
/// and that no unfinished job reads, objects first; returns how many.
/// Failures are logged: a version left behind is swept next time.
pub async fn sweep_superseded(st: &AppState) -> usize {
    let rows: Vec<(Uuid, String)> = match sqlx::query_as(
        "SELECT v.id, v.key FROM artifact_versions v
         WHERE v.superseded_at IS NOT NULL
           AND NOT EXISTS (
             SELECT 1 FROM job_artifacts ja JOIN jobs j ON j.id = ja.job_id
             WHERE ja.version = v.id AND j.state NOT IN ('succeeded', 'failed', 'cancelled'))
         LIMIT 100",
    )
    .fetch_all(&st.db)
    .await
    {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "sweeping superseded artifacts");
            return 0;
        }
    };
    let mut swept = 0;
    for (id, key) in rows {
        if let Err(e) = st.store.delete(&key).await {
            tracing::warn!(error = %e, %key, "deleting a superseded artifact");
            continue;
        }
        let gone = sqlx::query("DELETE FROM job_artifacts WHERE version = $1")
            .bind(id)
            .execute(&st.db)
            .await
            .and(
                sqlx::query(
                    "DELETE FROM artifact_versions WHERE id = $1 AND superseded_at IS NOT NULL",
                )
                .bind(id)
                .execute(&st.db)
                .await,
            );
        match gone {
            Ok(_) => swept += 1,
            Err(e) => tracing::warn!(error = %e, %key, "forgetting a superseded artifact"),
        }
    }
    swept
}
