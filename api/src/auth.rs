//! Who is calling, and what they may do.
//!
//! Users and admins present `Authorization: Bearer <token>`. A token is
//! either the bootstrap admin token from the configuration
//! (`--admin-token`) or one made through `POST /v1/tokens`, of which only the
//! SHA-256 is stored (`api_tokens`). [`authenticate`] resolves it to a
//! [`Principal`] — a user name and a [`Role`] — and puts it in the request's
//! extensions, where handlers take it as an extractor. An `admin` manages
//! tokens and executors and sees every job; a `user` sees and controls only
//! the jobs it submitted: [`job_visible`] answers another user's job with the
//! same 404 as a job that does not exist, so ids leak nothing. Executors
//! never pass here: their endpoints take the join token or their own
//! credential (see `routes::executors`), and those are not API tokens.
//!
//! Without an admin token the server runs **open** (every caller acts as
//! `admin`), which `Config::check_auth` allows only on a loopback address:
//! the single-user laptop of the quick start.
//!
//! [`SubmitLimiter`] is the per-user submit rate limit (a token bucket in
//! this process); the cap on a user's waiting jobs is enforced in Postgres
//! by the submit itself. Admins are exempt from both.

use crate::error::{ApiError, ApiResult};
use crate::AppState;
use axum::extract::{FromRequestParts, Path, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// The user name of the bootstrap admin token and of open mode.
pub const BOOTSTRAP_USER: &str = "admin";

pub use trainyard_common::api::Role;

/// The authenticated caller of a user-facing request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The user it acts as (jobs it submits belong to this name).
    pub user: String,
    /// What it may do.
    pub role: Role,
    /// The `api_tokens` row, when it came from one (not the bootstrap token
    /// or open mode).
    pub token_id: Option<Uuid>,
}

impl Principal {
    fn bootstrap() -> Principal {
        Principal {
            user: BOOTSTRAP_USER.into(),
            role: Role::Admin,
            token_id: None,
        }
    }

    /// Whether this caller is an admin.
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// Whether this caller may see a job belonging to `owner`.
    pub fn sees(&self, owner: &str) -> bool {
        self.is_admin() || self.user == owner
    }

    /// The owner to restrict listings to: `None` for admins (everything).
    pub fn scope(&self) -> Option<&str> {
        (!self.is_admin()).then_some(self.user.as_str())
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        parts
            .extensions
            .get::<Principal>()
            .cloned()
            .ok_or(ApiError::Unauthorized)
    }
}

/// Longest user name.
pub const MAX_USER_CHARS: usize = 64;

/// Whether `name` is a user name: 1–64 of `a-z 0-9 . _ -`, starting with a
/// letter or digit (the `api_tokens.owner` check, said once in Rust).
pub fn valid_user_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_USER_CHARS
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"._-".contains(c))
}

/// The bearer token of a request, if any.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

/// SHA-256 of a token, as stored.
pub fn hash_token(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// Compares without returning early on the first differing byte.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Resolves a request's credentials. A present but unknown, revoked or
/// expired token is a 401 even in open mode (the caller meant to be
/// somebody); an absent one is a 401 unless the server runs open.
pub async fn resolve(st: &AppState, headers: &HeaderMap) -> ApiResult<Principal> {
    let Some(given) = bearer(headers) else {
        return match st.config.admin_token {
            None => Ok(Principal::bootstrap()),
            Some(_) => Err(ApiError::Unauthorized),
        };
    };
    if let Some(admin) = st.config.admin_token.as_deref() {
        if constant_time_eq(given.as_bytes(), admin.as_bytes()) {
            return Ok(Principal::bootstrap());
        }
    }
    let row: Option<(Uuid, String, String)> = sqlx::query_as(
        "SELECT id, owner, role FROM api_tokens
         WHERE token_hash = $1 AND revoked_at IS NULL
           AND (expires_at IS NULL OR expires_at > clock_timestamp())",
    )
    .bind(hash_token(given))
    .fetch_optional(&st.db)
    .await?;
    let (id, user, role) = row.ok_or(ApiError::Unauthorized)?;
    Ok(Principal {
        user,
        role: Role::parse(&role)
            .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("token {id} has role {role:?}")))?,
        token_id: Some(id),
    })
}

/// Middleware of the user-facing `/v1` routes: resolves the caller into a
/// [`Principal`] or answers 401.
pub async fn authenticate(State(st): State<AppState>, mut req: Request, next: Next) -> Response {
    match resolve(&st, req.headers()).await {
        Ok(p) => {
            req.extensions_mut().insert(p);
            next.run(req).await
        }
        Err(e) => e.into_response(),
    }
}

/// Middleware of the admin-only routes (tokens, the executor listing): a
/// user is a 403. Runs inside [`authenticate`].
pub async fn require_admin(who: Principal, req: Request, next: Next) -> Response {
    if !who.is_admin() {
        return ApiError::Forbidden(format!(
            "{} {} needs the admin role; {:?} is a user",
            req.method(),
            req.uri().path(),
            who.user
        ))
        .into_response();
    }
    next.run(req).await
}

/// Middleware of every `/v1/jobs/{id}/…` route: another user's job answers
/// exactly as a missing one does (404), so a user cannot even learn that an
/// id exists. Admins skip the lookup; a malformed id is left to the
/// handler's 400.
pub async fn job_visible(
    State(st): State<AppState>,
    who: Principal,
    Path(params): Path<HashMap<String, String>>,
    req: Request,
    next: Next,
) -> Response {
    if who.is_admin() {
        return next.run(req).await;
    }
    let Some(id) = params.get("id").and_then(|s| Uuid::parse_str(s).ok()) else {
        return next.run(req).await;
    };
    match owner_of(&st.db, id).await {
        Ok(Some(owner)) if who.sees(&owner) => next.run(req).await,
        Ok(_) => ApiError::NotFound(format!("no job with id {id}")).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The owner of job `id`, if it exists.
pub async fn owner_of(db: &sqlx::PgPool, id: Uuid) -> ApiResult<Option<String>> {
    Ok(sqlx::query_scalar("SELECT owner FROM jobs WHERE id = $1")
        .bind(id)
        .fetch_optional(db)
        .await?)
}

/// A token bucket per user: `rate` submits a second on average, `burst` at
/// once. Lives in one API process (with several replicas each allows the
/// rate); entries of users who have been idle long enough to be full again
/// are dropped as the map grows, so it stays bounded by the active users.
pub struct SubmitLimiter {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

/// Users tracked before idle ones are pruned.
const PRUNE_AT: usize = 10_000;

impl SubmitLimiter {
    /// `rate` submits a second, bursts of `burst`.
    pub fn new(rate: f64, burst: u32) -> SubmitLimiter {
        SubmitLimiter {
            rate,
            burst: f64::from(burst.max(1)),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one submit of `user`'s allowance, or says how long until one
    /// is available.
    pub fn take(&self, user: &str) -> Result<(), Duration> {
        self.take_at(user, Instant::now())
    }

    fn take_at(&self, user: &str, now: Instant) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= PRUNE_AT {
            let full_after = Duration::from_secs_f64(self.burst / self.rate);
            buckets.retain(|_, (_, at)| now.saturating_duration_since(*at) < full_after);
        }
        let (tokens, at) = buckets.entry(user.to_owned()).or_insert((self.burst, now));
        let refilled = (*tokens + now.saturating_duration_since(*at).as_secs_f64() * self.rate)
            .min(self.burst);
        *at = now;
        if refilled >= 1.0 {
            *tokens = refilled - 1.0;
            Ok(())
        } else {
            *tokens = refilled;
            Err(Duration::from_secs_f64((1.0 - refilled) / self.rate))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_burst_then_the_rate() {
        let l = SubmitLimiter::new(2.0, 3);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(l.take_at("a", t0).is_ok());
        }
        let wait = l.take_at("a", t0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-9, "{wait:?}");
        // Another user has an allowance of its own.
        assert!(l.take_at("b", t0).is_ok());
        // Half a second later one more submit is allowed, not two.
        let t1 = t0 + Duration::from_millis(500);
        assert!(l.take_at("a", t1).is_ok());
        assert!(l.take_at("a", t1).is_err());
    }

    proptest! {
        /// Over any schedule, a user gets at most burst + rate × elapsed
        /// submits, and a refused one is told a wait after which it would
        /// be allowed.
        #[test]
        fn never_more_than_burst_plus_rate(
            rate in 0.1f64..100.0,
            burst in 1u32..50,
            gaps in proptest::collection::vec(0u64..2_000, 1..200),
        ) {
            let l = SubmitLimiter::new(rate, burst);
            let t0 = Instant::now();
            let mut t = t0;
            let mut allowed = 0u64;
            for g in gaps {
                t += Duration::from_millis(g);
                match l.take_at("u", t) {
                    Ok(()) => allowed += 1,
                    Err(wait) => {
                        prop_assert!(wait > Duration::ZERO);
                        prop_assert!(wait.as_secs_f64() <= 1.0 / rate + 1e-9);
                    }
                }
                let bound = f64::from(burst) + (t - t0).as_secs_f64() * rate;
                prop_assert!(allowed as f64 <= bound + 1e-6, "{allowed} > {bound}");
            }
        }
    }
}
