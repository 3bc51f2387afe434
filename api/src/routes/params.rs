//! Decoding what callers send, failing with problem details that name the
//! field: counts and cursors in query strings, JSON bodies (a syntax error
//! is a 400, a shape error a 422 with its path), and text from executors
//! made storable.

use crate::error::{ApiError, ApiResult};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use trainyard_common::cluster::MAX_LOG_CHARS;
use trainyard_common::spec::Violation;
use utoipa::IntoParams;

/// Query of an append-only log (`…/events`, `…/logs`).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AfterQuery {
    /// Only entries after this id (the `next_after` of the previous page).
    pub after: Option<String>,
    /// Page size (1–1000, default 500).
    pub limit: Option<String>,
}

/// The `limit` query parameter: `default` when absent, else 1–`max`.
pub fn parse_limit(raw: Option<&str>, default: i64, max: i64) -> ApiResult<i64> {
    parse_bounded("limit", raw, default, max)
}

/// A count query parameter named `field`: `default` when absent, else 1–`max`.
pub fn parse_bounded(field: &str, raw: Option<&str>, default: i64, max: i64) -> ApiResult<i64> {
    match raw {
        None => Ok(default),
        Some(s) => match s.parse::<i64>() {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            _ => Err(ApiError::bad_field(
                field,
                format!("must be an integer between 1 and {max}, got {s:?}"),
            )),
        },
    }
}

/// The `after` query parameter of an append-only log: 0 when absent.
pub fn parse_after(raw: Option<&str>) -> ApiResult<i64> {
    match raw {
        None => Ok(0),
        Some(s) => s.parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| {
            ApiError::bad_field(
                "after",
                format!("must be a non-negative integer, got {s:?}"),
            )
        }),
    }
}

/// A JSON body decoded into `T`: malformed JSON is a 400, JSON of the
/// wrong shape a 422 naming the field's path.
pub fn parse_body<T: DeserializeOwned>(bytes: &[u8]) -> ApiResult<T> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_err()
            || !matches!(inner.classify(), serde_json::error::Category::Data)
        {
            ApiError::MalformedJson(inner.to_string())
        } else {
            ApiError::Unprocessable(vec![Violation {
                field: if path == "." { String::new() } else { path },
                message: inner.to_string(),
            }])
        }
    })
}

/// Text from an executor as Postgres can store it: at most
/// `MAX_LOG_CHARS` characters, without NUL (which `text` columns refuse).
pub fn text(s: &str) -> String {
    s.chars()
        .filter(|&c| c != '\0')
        .take(MAX_LOG_CHARS)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_bounded() {
        assert_eq!(parse_limit(None, 50, 500).unwrap(), 50);
        assert_eq!(parse_limit(Some("500"), 50, 500).unwrap(), 500);
        for bad in ["0", "501", "-1", "ten", ""] {
            assert!(parse_limit(Some(bad), 50, 500).is_err(), "{bad}");
        }
    }
}
