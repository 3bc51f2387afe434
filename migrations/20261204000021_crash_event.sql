-- A role's model process died and its job tries again
-- (trainyard_common::event::EventKind::Crash).
ALTER TYPE event_kind ADD VALUE IF NOT EXISTS 'crash';
