//! Sharing the cluster: users' quotas (admins) and usage accounting.

use crate::{Call, Client, ClientError};
use reqwest::Method;
use trainyard_common::api::{QuotaInfo, QuotaLimits, QuotaList, UsageReport};

/// What `GET /v1/usage` covers: every field optional, as the API's defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageQuery {
    /// Start of the window, RFC 3339 (default: a day before `to`).
    pub from: Option<String>,
    /// End of the window, RFC 3339 (default: now).
    pub to: Option<String>,
    /// Only this user (admins; users always see their own).
    pub owner: Option<String>,
}

impl Client {
    /// `PUT /v1/quotas/{owner}` (admins): sets the user's limits (`None`
    /// fields are unlimited).
    pub async fn set_quota(
        &self,
        owner: &str,
        limits: &QuotaLimits,
    ) -> Result<QuotaInfo, ClientError> {
        let call =
            Call::new(Method::PUT, format!("/v1/quotas/{}", urlencoding(owner))).json(limits)?;
        self.call(call).await
    }

    /// `GET /v1/quotas/{owner}` (admins): the user's limits and what its
    /// jobs hold now.
    pub async fn quota(&self, owner: &str) -> Result<QuotaInfo, ClientError> {
        self.call(Call::get(format!("/v1/quotas/{}", urlencoding(owner))))
            .await
    }

    /// `GET /v1/quotas` (admins): every user with a quota.
    pub async fn quotas(&self) -> Result<QuotaList, ClientError> {
        self.call(Call::get("/v1/quotas".into())).await
    }

    /// `GET /v1/usage`: usage per user and per job over a window.
    pub async fn usage(&self, q: &UsageQuery) -> Result<UsageReport, ClientError> {
        self.call(
            Call::get("/v1/usage".into())
                .query("from", q.from.as_deref())
                .query("to", q.to.as_deref())
                .query("owner", q.owner.as_deref()),
        )
        .await
    }
}

/// A user name as one path segment: anything but a-z 0-9 . _ - is
/// percent-encoded, so a strange name cannot reach another path (the API
/// refuses it, naming `owner`). An all-dots name would still be a `..`
/// segment: callers check names first (the CLI does).
fn urlencoding(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'_' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn owners_stay_one_path_segment() {
        assert_eq!(super::urlencoding("alice"), "alice");
        assert_eq!(super::urlencoding("a/../jobs?x"), "a%2F..%2Fjobs%3Fx");
    }
}
