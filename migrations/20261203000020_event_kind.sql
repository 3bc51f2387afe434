-- The kinds of a job's event log, as trainyard_common::event::EventKind
-- lists them: a writer cannot store a kind no reader knows.
CREATE TYPE event_kind AS ENUM (
    'submitted', 'transition', 'strategy', 'placement', 'inspection',
    'checkpoint', 'result', 'provisioning', 'suspect', 'preemption',
    'stuck', 'straggler'
);
ALTER TABLE job_events ALTER COLUMN kind TYPE event_kind USING kind::event_kind;
