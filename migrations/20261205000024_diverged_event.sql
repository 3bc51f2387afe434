-- A job's loss diverged (trainyard_common::event::EventKind::Diverged).
ALTER TYPE event_kind ADD VALUE IF NOT EXISTS 'diverged';
