-- A script job's own packages on a rank: resolving, installing, ready,
-- cached or failed (trainyard_common::event::EventKind::Packages).
ALTER TYPE event_kind ADD VALUE IF NOT EXISTS 'packages';
