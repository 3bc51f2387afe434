//! API tokens: the role a token has, the request that makes one, what is
//! listed of them, and who a token's holder is.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Manages tokens and executors; sees and controls every job.
    Admin,
    /// Sees and controls only its own jobs.
    User,
}

impl Role {
    /// The name stored in Postgres.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::User => "user",
        }
    }

    /// The role named `s` as stored in Postgres.
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "admin" => Some(Role::Admin),
            "user" => Some(Role::User),
            _ => None,
        }
    }
}

/// What a new token is for.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewToken {
    /// The user the token acts as: 1–64 of `a-z 0-9 . _ -`, starting with
    /// a letter or digit. Jobs it submits belong to this user.
    #[schema(example = "alice")]
    pub owner: String,
    /// `user` (its own jobs only) or `admin`.
    pub role: Role,
    /// What it is for, shown in listings (at most 128 characters).
    #[serde(default)]
    #[schema(example = "alice's laptop")]
    pub label: String,
    /// Seconds until it stops working (none: until revoked).
    #[serde(default)]
    pub expires_in_secs: Option<u64>,
}

/// A token as listings show it (never the token itself).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenInfo {
    /// Token id (for revoking).
    pub id: Uuid,
    /// The user it acts as.
    pub owner: String,
    /// What it may do.
    pub role: Role,
    /// What it is for.
    pub label: String,
    /// Who made it.
    pub created_by: String,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// When it stops working, if ever.
    pub expires_at: Option<DateTime<Utc>>,
    /// When it was revoked, if it was.
    pub revoked_at: Option<DateTime<Utc>>,
}

/// A new token: its details, and the token itself (shown only here).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CreatedToken {
    /// The token's details.
    #[serde(flatten)]
    pub info: TokenInfo,
    /// The bearer token. Store it now: only its hash is kept.
    pub token: String,
}

/// Every token, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenList {
    /// The tokens (revoked ones too, with `revoked_at`).
    pub tokens: Vec<TokenInfo>,
}

/// Who the server takes the caller for.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WhoAmI {
    /// The user name (`admin` for the bootstrap token and open mode).
    pub user: String,
    /// The role.
    pub role: Role,
    /// The token's id, when the caller used one made by `POST /v1/tokens`.
    pub token_id: Option<Uuid>,
    /// Whether the server runs without an admin token (every caller is the
    /// admin; loopback only).
    pub open: bool,
}
