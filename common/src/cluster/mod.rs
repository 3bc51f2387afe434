//! Messages between executors and the control plane: registration,
//! heartbeats, and the assignments a heartbeat answers with.
//!
//! An executor registers once (with the cluster join token) and receives its
//! id and its own credential; it then heartbeats about every second,
//! reporting the roles it runs, and gets back every role assigned to it at
//! the job's current generation with the peers it must talk to. The
//! generation is the fencing token of the data plane.
//!
//! A PS shard's hot standby (the spec's `replicas`) is a role of its own
//! kind, [`RoleKind::Standby`], whose index is the shard it stands by for;
//! it stands in the assignment's `parameter_servers` beside the primaries
//! ([`PsPeer::standby`]), and [`Assignment::primaries`] and
//! [`Assignment::standby_of`] tell them apart. The API's JSON (and the data
//! plane's handshake) still name a standby a `ps` role numbered
//! [`wire_index`] (above every shard): the serde forms of [`RoleKind`],
//! [`RoleKey`] and [`PsPeer`] translate, here and nowhere else, so every
//! reader that knows only primaries sees it as a PS role of its own.
//!
//! One file per message family: [`register`] (joining, and an executor's
//! states), [`heartbeat`], [`assignment`] (roles, peers, inspections),
//! [`roles`] (role kinds, keys and their wire form), [`suspect`] and
//! [`report`] (what a role reports and how it ended). Every item is
//! re-exported here.

pub use crate::checkpoint::Range;

pub mod assignment;
pub mod heartbeat;
pub mod register;
pub mod report;
pub mod roles;
pub mod suspect;

pub use assignment::*;
pub use heartbeat::*;
pub use register::*;
pub use report::*;
pub use roles::*;
pub use suspect::*;
