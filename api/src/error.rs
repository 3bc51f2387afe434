//! The one error type at the HTTP boundary, rendered as RFC 9457 problem
//! details (`application/problem+json`).
//!
//! Client errors name the offending field in `errors[].field`. Internal
//! errors are logged with their cause chain and leave as an opaque 500.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use trainyard_common::spec::{SpecError, Violation};
use utoipa::ToSchema;

/// Media type of problem details.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// A problem details document (RFC 9457).
#[derive(Debug, Serialize, ToSchema)]
pub struct Problem {
    /// A URI reference naming the kind of problem.
    #[serde(rename = "type")]
    #[schema(example = "/problems/invalid-spec")]
    pub kind: String,
    /// Short summary of the kind of problem.
    #[schema(example = "Invalid job spec")]
    pub title: String,
    /// The HTTP status code.
    #[schema(example = 422)]
    pub status: u16,
    /// What went wrong this time.
    pub detail: String,
    /// Every offending field, when the problem is about fields.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<Violation>,
}

/// Everything a handler can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: the body is not JSON.
    #[error("malformed JSON: {0}")]
    MalformedJson(String),
    /// 400: a path, query or header value is wrong.
    #[error("{}", .0.iter().map(|v| v.to_string()).collect::<Vec<_>>().join("; "))]
    BadRequest(Vec<Violation>),
    /// 401: missing or wrong credentials.
    #[error("missing or invalid bearer token")]
    Unauthorized,
    /// 403: authenticated, but the role does not allow this.
    #[error("{0}")]
    Forbidden(String),
    /// 404: no such resource.
    #[error("{0}")]
    NotFound(String),
    /// 405: the route exists but not with this method.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// 409: the resource's state forbids the operation.
    #[error("{0}")]
    Conflict(String),
    /// 410: the resource existed but is gone for good.
    #[error("{0}")]
    Gone(String),
    /// 408: the request took longer than the configured timeout.
    #[error("the request took longer than {0} s")]
    Timeout(u64),
    /// 408: an upload stalled or crawled.
    #[error("{0}")]
    Stalled(String),
    /// 413: the body is larger than the limit.
    #[error("request body larger than {0} bytes")]
    PayloadTooLarge(usize),
    /// 413: an upload over a size limit, naming the limit and where the
    /// caller stands.
    #[error("{0}")]
    TooLarge(String),
    /// 415: wrong or missing Content-Type.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// 422: well-formed but invalid (every violation listed).
    #[error("{} invalid field(s)", .0.len())]
    Unprocessable(Vec<Violation>),
    /// 429: over a per-user limit; retry after the given seconds
    /// (`Retry-After`).
    #[error("{detail}")]
    TooManyRequests {
        /// What limit, and where the caller stands.
        detail: String,
        /// Whole seconds until a retry can succeed (at least 1).
        retry_after: u64,
    },
    /// 503: a dependency is down.
    #[error("{0}")]
    Unavailable(String),
    /// 500: a bug or an unexpected failure; details are logged, not returned.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => {
                ApiError::Unavailable(format!("database unavailable: {e}"))
            }
            // Connection exceptions (08…), a statement timeout or a server
            // shutting down (57…), too many connections (53300): the
            // database is away or overloaded for now, not a bug here.
            sqlx::Error::Database(ref d)
                if d.code().is_some_and(|c| {
                    c.starts_with("08") || c.starts_with("57") || c == "53300"
                }) =>
            {
                ApiError::Unavailable(format!("database unavailable: {e}"))
            }
            e => ApiError::Internal(e.into()),
        }
    }
}

impl From<SpecError> for ApiError {
    fn from(e: SpecError) -> Self {
        match e {
            SpecError::Syntax(m) => ApiError::MalformedJson(m),
            SpecError::Shape(v) | SpecError::Invalid(v) => ApiError::Unprocessable(v),
        }
    }
}

impl ApiError {
    /// A 400 naming one field.
    pub fn bad_field(field: &str, message: impl Into<String>) -> ApiError {
        ApiError::BadRequest(vec![Violation {
            field: field.into(),
            message: message.into(),
        }])
    }

    /// A 422 naming one field.
    pub fn invalid_field(field: &str, message: impl Into<String>) -> ApiError {
        ApiError::Unprocessable(vec![Violation {
            field: field.into(),
            message: message.into(),
        }])
    }

    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        use ApiError::*;
        match self {
            MalformedJson(_) => (StatusCode::BAD_REQUEST, "malformed-json", "Malformed JSON"),
            BadRequest(_) => (StatusCode::BAD_REQUEST, "bad-request", "Bad request"),
            Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized", "Unauthorized"),
            Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden", "Forbidden"),
            NotFound(_) => (StatusCode::NOT_FOUND, "not-found", "Not found"),
            MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
            ),
            Conflict(_) => (StatusCode::CONFLICT, "conflict", "Conflict"),
            Gone(_) => (StatusCode::GONE, "gone", "Gone"),
            Timeout(_) | Stalled(_) => (StatusCode::REQUEST_TIMEOUT, "timeout", "Request timeout"),
            PayloadTooLarge(_) | TooLarge(_) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload-too-large",
                "Payload too large",
            ),
            UnsupportedMediaType(_) => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "Unsupported media type",
            ),
            Unprocessable(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-spec",
                "Invalid request",
            ),
            TooManyRequests { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "too-many-requests",
                "Too many requests",
            ),
            Unavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "Service unavailable",
            ),
            Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal server error",
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, slug, title) = self.parts();
        let retry_after = match &self {
            ApiError::TooManyRequests { retry_after, .. } => Some((*retry_after).max(1)),
            _ => None,
        };
        let detail = match &self {
            ApiError::Internal(e) => {
                tracing::error!(error = ?e, "internal error");
                "an internal error occurred; it has been logged".to_owned()
            }
            ApiError::Unavailable(m) => {
                tracing::warn!(%m, "dependency unavailable");
                "a dependency is unavailable; retry later".to_owned()
            }
            other => other.to_string(),
        };
        let errors = match self {
            ApiError::BadRequest(v) | ApiError::Unprocessable(v) => v,
            ApiError::PayloadTooLarge(_) | ApiError::TooLarge(_) => vec![Violation {
                field: "body".into(),
                message: detail.clone(),
            }],
            ApiError::UnsupportedMediaType(_) => vec![Violation {
                field: "Content-Type".into(),
                message: detail.clone(),
            }],
            ApiError::Unauthorized => vec![Violation {
                field: "Authorization".into(),
                message: detail.clone(),
            }],
            _ => Vec::new(),
        };
        let problem = Problem {
            kind: format!("/problems/{slug}"),
            title: title.into(),
            status: status.as_u16(),
            detail,
            errors,
        };
        let mut resp = (status, axum::Json(problem)).into_response();
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(secs) = retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

/// Result of a handler.
pub type ApiResult<T> = Result<T, ApiError>;
