//! `/v1/tokens` (admin only): make, list and revoke API tokens; and
//! `/v1/whoami`, which tells any caller who the server takes it for.
//!
//! A token is 32 random bytes, hex-encoded behind a `ty_` prefix; only its
//! SHA-256 is stored, and the token itself is in the one response that
//! makes it. Revoking is immediate (every request looks its token up) and
//! idempotent. See [`crate::auth`] for how tokens are checked.

use super::params::parse_body;
use crate::auth::{hash_token, valid_user_name, Principal, Role, MAX_USER_CHARS};
use crate::error::{ApiError, ApiResult, Problem};
use crate::extract::{JsonBytes, TokenId};
use crate::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use sqlx::postgres::PgRow;
use sqlx::Row;
pub use trainyard_common::api::{CreatedToken, NewToken, TokenInfo, TokenList, WhoAmI};
use trainyard_common::spec::Violation;
use uuid::Uuid;

/// Longest token label.
pub const MAX_LABEL_CHARS: usize = 128;
/// Longest lifetime of a token, in seconds (ten years).
pub const MAX_EXPIRES_IN_SECS: u64 = 10 * 365 * 24 * 3600;
/// Most tokens one listing returns (newest first).
pub const MAX_LISTED: i64 = 10_000;

const TOKEN_COLUMNS: &str =
    "id, owner, role, label, created_by, created_at, expires_at, revoked_at";

fn info_from_row(r: &PgRow) -> ApiResult<TokenInfo> {
    let role: String = r.try_get("role")?;
    Ok(TokenInfo {
        id: r.try_get("id")?,
        owner: r.try_get("owner")?,
        role: match role.as_str() {
            "admin" => Role::Admin,
            "user" => Role::User,
            other => return Err(ApiError::Internal(anyhow::anyhow!("role {other:?}"))),
        },
        label: r.try_get("label")?,
        created_by: r.try_get("created_by")?,
        created_at: r.try_get("created_at")?,
        expires_at: r.try_get("expires_at")?,
        revoked_at: r.try_get("revoked_at")?,
    })
}

fn check(t: &NewToken) -> Vec<Violation> {
    let mut v = Vec::new();
    let mut bad = |field: &str, message: String| {
        v.push(Violation {
            field: field.into(),
            message,
        })
    };
    if !valid_user_name(&t.owner) {
        bad(
            "owner",
            format!(
                "must be 1 to {MAX_USER_CHARS} of a-z 0-9 . _ -, starting with a letter or digit; got {:?}",
                t.owner
            ),
        );
    }
    if t.label.chars().count() > MAX_LABEL_CHARS {
        bad(
            "label",
            format!("must be at most {MAX_LABEL_CHARS} characters"),
        );
    } else if t.label.chars().any(char::is_control) {
        bad("label", "must not contain control characters".into());
    }
    if let Some(s) = t.expires_in_secs {
        if s == 0 || s > MAX_EXPIRES_IN_SECS {
            bad(
                "expires_in_secs",
                format!("must be between 1 and {MAX_EXPIRES_IN_SECS}, got {s}"),
            );
        }
    }
    v
}

/// Make a token (admin only).
///
/// The response carries the token once; only its SHA-256 is stored.
#[utoipa::path(
    post, path = "/v1/tokens", operation_id = "create_token", tag = "tokens",
    request_body(content = NewToken, content_type = "application/json"),
    responses(
        (status = 201, description = "The new token, shown only now", body = CreatedToken),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid fields: every violation", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn create(
    State(st): State<AppState>,
    who: Principal,
    JsonBytes(body): JsonBytes,
) -> ApiResult<(StatusCode, Json<CreatedToken>)> {
    let new: NewToken = parse_body(&body)?;
    let violations = check(&new);
    if !violations.is_empty() {
        return Err(ApiError::Unprocessable(violations));
    }
    let token = format!(
        "ty_{}",
        hex::encode(trainyard_scheduler::service::new_secret())
    );
    let row = sqlx::query(&format!(
        "INSERT INTO api_tokens (id, owner, role, label, token_hash, created_by, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6,
                 clock_timestamp() + make_interval(secs => $7::float8))
         RETURNING {TOKEN_COLUMNS}"
    ))
    .bind(Uuid::now_v7())
    .bind(&new.owner)
    .bind(new.role.as_str())
    .bind(&new.label)
    .bind(hash_token(&token))
    .bind(&who.user)
    .bind(new.expires_in_secs.map(|s| s as f64))
    .fetch_one(&st.db)
    .await?;
    let info = info_from_row(&row)?;
    tracing::info!(token = %info.id, owner = %info.owner, role = info.role.as_str(), by = %who.user, "token made");
    Ok((StatusCode::CREATED, Json(CreatedToken { info, token })))
}

/// List tokens (admin only), newest first; never the tokens themselves.
#[utoipa::path(
    get, path = "/v1/tokens", operation_id = "list_tokens", tag = "tokens",
    responses(
        (status = 200, description = "Every token", body = TokenList),
        (status = 401, description = "Missing or wrong token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list(State(st): State<AppState>) -> ApiResult<Json<TokenList>> {
    let rows = sqlx::query(&format!(
        "SELECT {TOKEN_COLUMNS} FROM api_tokens ORDER BY created_at DESC, id DESC LIMIT $1"
    ))
    .bind(MAX_LISTED)
    .fetch_all(&st.db)
    .await?;
    Ok(Json(TokenList {
        tokens: rows.iter().map(info_from_row).collect::<ApiResult<_>>()?,
    }))
}

/// Revoke a token (admin only); idempotent.
///
/// Requests with it are refused from now on; the jobs its user submitted
/// keep running.
#[utoipa::path(
    delete, path = "/v1/tokens/{id}", operation_id = "revoke_token", tag = "tokens",
    params(("id" = Uuid, Path, description = "Token id")),
    responses(
        (status = 200, description = "The revoked token", body = TokenInfo),
        (status = 400, description = "The id is not a UUID", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such token", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn revoke(
    State(st): State<AppState>,
    who: Principal,
    TokenId(id): TokenId,
) -> ApiResult<Json<TokenInfo>> {
    let row = sqlx::query(&format!(
        "UPDATE api_tokens SET revoked_at = coalesce(revoked_at, clock_timestamp())
         WHERE id = $1 RETURNING {TOKEN_COLUMNS}"
    ))
    .bind(id)
    .fetch_optional(&st.db)
    .await?
    .ok_or_else(|| ApiError::NotFound(format!("no token with id {id}")))?;
    tracing::info!(token = %id, by = %who.user, "token revoked");
    Ok(Json(info_from_row(&row)?))
}

/// Who the server takes the caller for.
#[utoipa::path(
    get, path = "/v1/whoami", operation_id = "whoami", tag = "tokens",
    responses(
        (status = 200, description = "The caller's user and role", body = WhoAmI),
        (status = 401, description = "Missing or wrong token", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn whoami(State(st): State<AppState>, who: Principal) -> Json<WhoAmI> {
    Json(WhoAmI {
        user: who.user,
        role: who.role,
        token_id: who.token_id,
        open: st.config.admin_token.is_none(),
    })
}
