//! Request extractors that fail with our problem details instead of axum's
//! plain-text rejections: a JSON body (Content-Type and size checked), a job
//! id from the path, and the query of the job list.

use crate::error::ApiError;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use uuid::Uuid;

/// The raw bytes of a body declared as JSON (`application/json` or any
/// `+json` type), within the configured size limit.
pub struct JsonBytes(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for JsonBytes {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let ct = req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let essence = ct
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        let is_json = essence == "application/json"
            || (essence.starts_with("application/") && essence.ends_with("+json"));
        if !is_json {
            let got = if ct.is_empty() {
                "none".to_owned()
            } else {
                format!("{ct:?}")
            };
            return Err(ApiError::UnsupportedMediaType(format!(
                "Content-Type must be application/json, got {got}"
            )));
        }
        let limit = req
            .extensions()
            .get::<BodyLimit>()
            .map_or(usize::MAX, |l| l.0);
        match Bytes::from_request(req, state).await {
            Ok(b) => Ok(JsonBytes(b)),
            Err(e) if is_length_limit(&e) => Err(ApiError::PayloadTooLarge(limit)),
            Err(e) => Err(ApiError::bad_field(
                "body",
                format!("cannot read body: {e}"),
            )),
        }
    }
}

fn is_length_limit(e: &axum::extract::rejection::BytesRejection) -> bool {
    e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE
}

/// The body limit in force, put in request extensions by the router so that
/// the 413 can say it.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// An extractor of the route's `{id}` as the id of one kind of resource,
/// so that a handler's signature says which.
macro_rules! path_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        pub struct $name(pub Uuid);

        impl<S: Send + Sync> FromRequestParts<S> for $name {
            type Rejection = ApiError;

            async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
                path_uuid(parts, state).await.map($name)
            }
        }
    };
}

path_id!(
    /// The `{id}` of a job's route (`/v1/jobs/{id}/…`) as a UUID; anything
    /// else is a 400 naming `id`.
    JobId
);
path_id!(
    /// The `{id}` of an executor's route (`/v1/executors/{id}/…`) as a
    /// UUID; anything else is a 400 naming `id`.
    ExecutorId
);
path_id!(
    /// The `{id}` of a token's route (`/v1/tokens/{id}`) as a UUID;
    /// anything else is a 400 naming `id`.
    TokenId
);

/// The route's one path parameter, `{id}`, as a UUID.
async fn path_uuid<S: Send + Sync>(parts: &mut Parts, state: &S) -> Result<Uuid, ApiError> {
    let Path(raw) = Path::<String>::from_request_parts(parts, state)
        .await
        .map_err(|e| ApiError::bad_field("id", e.body_text()))?;
    Uuid::parse_str(&raw)
        .map_err(|_| ApiError::bad_field("id", format!("must be a UUID, got {raw:?}")))
}

/// A query string decoded into `T`; unknown or malformed parameters are a
/// 400 naming them.
pub struct QueryParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let q = parts.uri.query().unwrap_or("");
        serde_urlencoded::from_str(q)
            .map(QueryParams)
            .map_err(|e| ApiError::bad_field("query", e.to_string()))
    }
}
