//! Roles and their names: a role's kind and index, its key (job,
//! generation, kind, index), and the wire form that names a PS shard's
//! standby as a `ps` role numbered above every shard.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// On the wire a standby's index is this plus its shard (above every shard
/// number: a job has at most [`crate::spec::MAX_PARAMETER_SERVERS`]
/// shards).
const STANDBY_INDEX_BASE: u32 = 1 << 16;

/// The index role `index` of `kind` has on the wire — the API's JSON and
/// the data plane's handshake, where a standby is a `ps` role numbered
/// above every shard.
pub fn wire_index(kind: RoleKind, index: u32) -> u32 {
    match kind {
        RoleKind::Standby => STANDBY_INDEX_BASE + index,
        RoleKind::Ps | RoleKind::Worker => index,
    }
}

/// The role a wire (`ps` or `worker`, index) names.
pub(super) fn from_wire(kind: RoleKind, index: u32) -> (RoleKind, u32) {
    match kind {
        RoleKind::Ps if index >= STANDBY_INDEX_BASE => {
            (RoleKind::Standby, index - STANDBY_INDEX_BASE)
        }
        other => (other, index),
    }
}

/// A role kind. The API's JSON knows `ps` and `worker`: a standby is
/// written `ps` (its index or flag says which; see [`wire_index`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RoleKind {
    /// A parameter-server shard (index = shard).
    Ps,
    /// A worker (index = rank).
    Worker,
    /// A PS shard's hot standby (index = its shard).
    Standby,
}

/// A role kind.
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
enum ApiRoleKind {
    Ps,
    Worker,
}

impl RoleKind {
    /// The name used in Postgres.
    pub fn as_str(self) -> &'static str {
        match self {
            RoleKind::Ps => "ps",
            RoleKind::Worker => "worker",
            RoleKind::Standby => "standby",
        }
    }

    /// The kind Postgres names `s`.
    pub fn parse(s: &str) -> Option<RoleKind> {
        [RoleKind::Ps, RoleKind::Worker, RoleKind::Standby]
            .into_iter()
            .find(|k| k.as_str() == s)
    }

    /// The name the API's JSON uses (a standby is a `ps` role there).
    pub fn api_name(self) -> &'static str {
        match self {
            RoleKind::Worker => "worker",
            RoleKind::Ps | RoleKind::Standby => "ps",
        }
    }

    /// Whether it serves a PS shard (as the shard or its standby).
    pub fn is_ps(self) -> bool {
        self != RoleKind::Worker
    }
}

impl Serialize for RoleKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            RoleKind::Worker => ApiRoleKind::Worker,
            RoleKind::Ps | RoleKind::Standby => ApiRoleKind::Ps,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for RoleKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<RoleKind, D::Error> {
        Ok(match ApiRoleKind::deserialize(d)? {
            ApiRoleKind::Ps => RoleKind::Ps,
            ApiRoleKind::Worker => RoleKind::Worker,
        })
    }
}

impl utoipa::PartialSchema for RoleKind {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        <ApiRoleKind as utoipa::PartialSchema>::schema()
    }
}

impl ToSchema for RoleKind {
    fn name() -> std::borrow::Cow<'static, str> {
        "RoleKind".into()
    }
}

/// A role an executor runs, as it reports it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema,
)]
#[serde(from = "RoleKeyJson", into = "RoleKeyJson", deny_unknown_fields)]
pub struct RoleKey {
    /// Job id.
    pub job_id: Uuid,
    /// Generation the role was started for.
    pub generation: i64,
    /// Kind.
    pub role: RoleKind,
    /// Shard or rank.
    pub index: u32,
}

impl RoleKey {
    /// Its index on the wire (see [`wire_index`]).
    pub fn wire_index(&self) -> u32 {
        wire_index(self.role, self.index)
    }
}

/// A [`RoleKey`] as the API's JSON has it.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoleKeyJson {
    job_id: Uuid,
    generation: i64,
    role: RoleKind,
    index: u32,
}

impl From<RoleKeyJson> for RoleKey {
    fn from(j: RoleKeyJson) -> RoleKey {
        let (role, index) = from_wire(j.role, j.index);
        RoleKey {
            job_id: j.job_id,
            generation: j.generation,
            role,
            index,
        }
    }
}

impl From<RoleKey> for RoleKeyJson {
    fn from(k: RoleKey) -> RoleKeyJson {
        RoleKeyJson {
            job_id: k.job_id,
            generation: k.generation,
            role: k.role,
            index: k.wire_index(),
        }
    }
}

#[cfg(test)]
mod role_wire_tests {
    use super::*;
    use crate::cluster::PsPeer;
    use serde_json::json;

    /// A standby is a `ps` role numbered above every shard on the wire,
    /// and its own kind, numbered by its shard, in Rust.
    #[test]
    fn a_standby_keeps_its_wire_form_and_is_typed_in_rust() {
        let key = RoleKey {
            job_id: Uuid::nil(),
            generation: 4,
            role: RoleKind::Standby,
            index: 2,
        };
        let wire = serde_json::to_value(key).unwrap();
        assert_eq!(
            wire,
            json!({"job_id": Uuid::nil(), "generation": 4, "role": "ps", "index": 65538})
        );
        assert_eq!(serde_json::from_value::<RoleKey>(wire).unwrap(), key);
        for (role, index) in [(RoleKind::Ps, 2), (RoleKind::Worker, 70_000)] {
            let k = RoleKey { role, index, ..key };
            let wire = serde_json::to_value(k).unwrap();
            assert_eq!(wire["index"], index);
            assert_eq!(serde_json::from_value::<RoleKey>(wire).unwrap(), k);
        }
        assert!(serde_json::from_value::<RoleKey>(
            json!({"job_id": Uuid::nil(), "generation": 4, "role": "standby", "index": 2})
        )
        .is_err());
        assert!(serde_json::from_value::<RoleKey>(
            json!({"job_id": Uuid::nil(), "generation": 4, "role": "ps", "index": 2, "extra": 1})
        )
        .is_err());
        let peer = PsPeer {
            shard: 1,
            standby: true,
            executor_id: Uuid::nil(),
            address: "a:1".into(),
            ranges: Vec::new(),
        };
        let wire = serde_json::to_value(&peer).unwrap();
        assert_eq!(wire["shard"], 65537);
        assert_eq!(wire.as_object().unwrap().len(), 4);
        assert_eq!(serde_json::from_value::<PsPeer>(wire).unwrap(), peer);
        for kind in [RoleKind::Ps, RoleKind::Worker, RoleKind::Standby] {
            assert_eq!(RoleKind::parse(kind.as_str()), Some(kind));
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.api_name());
        }
    }
}
