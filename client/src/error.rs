//! What a request can fail with ([`ClientError`]), and the API's problem
//! document ([`Problem`], RFC 9457) as a client reads it.
//!
//! The problem is read leniently: a proxy in front of the API may answer
//! with HTML or an empty body, and its status alone must still make a
//! useful one-line error.

use std::fmt;
use std::time::Duration;
use trainyard_common::Violation;

/// Longest part of a body that is not a problem document kept as its
/// detail.
const SNIPPET_CHARS: usize = 200;

/// Why a request did not get the answer it asked for.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No answer: the connection failed or broke (refused, reset, DNS, TLS).
    #[error("cannot reach {url}: {cause}")]
    Unreachable {
        /// The URL asked.
        url: String,
        /// The innermost cause ("Connection refused (os error 111)").
        cause: String,
    },
    /// No answer within the client's request timeout.
    #[error("no answer from {url} within {} s", after.as_secs())]
    Timeout {
        /// The URL asked.
        url: String,
        /// The timeout.
        after: Duration,
    },
    /// The API answered with an error status (its problem document parsed).
    #[error("{0}")]
    Status(Box<Problem>),
    /// A success whose body is not what the endpoint documents.
    #[error("{url} answered {} with a body that {reason}", status_line(*status))]
    Decode {
        /// The URL asked.
        url: String,
        /// The HTTP status.
        status: u16,
        /// What is wrong with the body ("is not JSON", or serde's error).
        reason: String,
    },
    /// The HTTP client could not be set up (TLS roots, a bad base URL).
    #[error("cannot set up the HTTP client: {0}")]
    Setup(String),
}

impl ClientError {
    /// The HTTP status of an error answer.
    pub fn status(&self) -> Option<u16> {
        self.problem().map(|p| p.status)
    }

    /// The problem document of an error answer.
    pub fn problem(&self) -> Option<&Problem> {
        match self {
            ClientError::Status(p) => Some(p),
            _ => None,
        }
    }

    /// Whether the same request may succeed later: no answer, or an answer
    /// that says so (5xx, 408 Request Timeout, 429 Too Many Requests).
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Unreachable { .. } | ClientError::Timeout { .. } => true,
            ClientError::Status(p) => p.status >= 500 || p.status == 408 || p.status == 429,
            ClientError::Decode { .. } | ClientError::Setup(_) => false,
        }
    }

    /// A transport failure of reqwest, for `url`.
    pub(crate) fn transport(url: &str, e: &reqwest::Error, timeout: Duration) -> ClientError {
        if e.is_timeout() {
            return ClientError::Timeout {
                url: url.to_owned(),
                after: timeout,
            };
        }
        // The innermost cause says it best ("Connection refused (os error 111)").
        let mut cause: &dyn std::error::Error = e;
        while let Some(inner) = cause.source() {
            cause = inner;
        }
        ClientError::Unreachable {
            url: url.to_owned(),
            cause: cause.to_string(),
        }
    }
}

/// A status with its reason phrase, as HTTP writes it (`200 OK`).
fn status_line(status: u16) -> String {
    match reqwest::StatusCode::from_u16(status) {
        Ok(code) => code.to_string(),
        Err(_) => status.to_string(),
    }
}

/// An error answer of the API: its `application/problem+json` document, or
/// what could be made of a body that is not one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The HTTP status.
    pub status: u16,
    /// The document's `type` (a URI reference naming the kind of problem).
    pub kind: Option<String>,
    /// Short summary: the document's `title`, else the status with its
    /// reason phrase.
    pub title: String,
    /// What went wrong this time (the document's `detail`; for a body that
    /// is not a problem document, its first 200 characters).
    pub detail: String,
    /// Every offending field the document names (`errors[]`).
    pub errors: Vec<Violation>,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.status, self.title, self.detail)
    }
}

impl Problem {
    /// The problem an answer with `status` and `body` describes.
    pub fn from_body(status: u16, body: &str) -> Problem {
        let code = reqwest::StatusCode::from_u16(status).ok();
        let Ok(doc) = serde_json::from_str::<serde_json::Value>(body) else {
            let snippet: String = body.chars().take(SNIPPET_CHARS).collect();
            return Problem {
                status,
                kind: None,
                title: code
                    .and_then(|c| c.canonical_reason())
                    .unwrap_or("error")
                    .to_owned(),
                detail: snippet.trim().to_owned(),
                errors: Vec::new(),
            };
        };
        let text = |v: Option<&serde_json::Value>| {
            v.and_then(serde_json::Value::as_str).map(str::to_owned)
        };
        let errors = doc
            .get("errors")
            .and_then(serde_json::Value::as_array)
            .map(|errs| {
                errs.iter()
                    .map(|e| Violation {
                        field: text(e.get("field")).unwrap_or_default(),
                        message: text(e.get("message")).unwrap_or_default(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Problem {
            status,
            kind: text(doc.get("type")),
            title: text(doc.get("title")).unwrap_or_else(|| match code {
                Some(c) => c.to_string(),
                None => status.to_string(),
            }),
            detail: text(doc.get("detail")).unwrap_or_default(),
            errors,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_keep_their_field_errors() {
        let body = r#"{"type": "/problems/invalid-spec", "title": "Invalid request", "status": 422,
            "detail": "1 invalid field(s)",
            "errors": [{"field": "batch_size", "message": "must be between 1 and 65536, got 0"}]}"#;
        let p = Problem::from_body(422, body);
        assert_eq!(p.to_string(), "422 Invalid request: 1 invalid field(s)");
        assert_eq!(p.kind.as_deref(), Some("/problems/invalid-spec"));
        assert_eq!(
            p.errors,
            vec![Violation {
                field: "batch_size".to_owned(),
                message: "must be between 1 and 65536, got 0".to_owned()
            }]
        );
    }

    #[test]
    fn a_body_that_is_not_a_problem_still_makes_one_line() {
        let plain = Problem::from_body(502, "  upstream down\n");
        assert_eq!(plain.to_string(), "502 Bad Gateway: upstream down");
        let untitled = Problem::from_body(404, r#"{"detail": "gone"}"#);
        assert_eq!(untitled.to_string(), "404 404 Not Found: gone");
        let long = Problem::from_body(500, &"x".repeat(1000));
        assert_eq!(long.detail.len(), SNIPPET_CHARS);
        assert_eq!(Problem::from_body(599, "").title, "error");
    }

    #[test]
    fn errors_say_whether_they_may_pass() {
        let status = |s| ClientError::Status(Box::new(Problem::from_body(s, "")));
        assert!(status(503).is_transient());
        assert!(!status(404).is_transient());
        assert_eq!(status(404).status(), Some(404));
        let down = ClientError::Unreachable {
            url: "http://127.0.0.1:9/v1/jobs".into(),
            cause: "Connection refused (os error 111)".into(),
        };
        assert!(down.is_transient());
        assert_eq!(down.status(), None);
    }
}
