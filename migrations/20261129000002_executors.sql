-- Executors, their assignments, and what the scheduler needs on jobs.

ALTER TABLE jobs
    -- Copied from the spec at submit: the scheduler orders the queue by it.
    ADD COLUMN priority integer NOT NULL DEFAULT 0,
    -- The strategy the scheduler resolved (`auto` decided) at first placement.
    ADD COLUMN strategy text CHECK (strategy IN ('parameter_server', 'allreduce')),
    -- Per-job secret for the data plane, made at first placement and handed
    -- only to the job's executors.
    ADD COLUMN secret bytea;

CREATE INDEX jobs_queue_idx ON jobs (priority DESC, created_at)
    WHERE state NOT IN ('succeeded', 'failed', 'cancelled');

CREATE TYPE executor_state AS ENUM ('live', 'draining', 'lost', 'left');

CREATE TABLE executors (
    id                uuid PRIMARY KEY,
    name              text NOT NULL,
    -- host:port of its data-plane listener, given to its peers.
    address           text NOT NULL,
    resources         jsonb NOT NULL,
    labels            jsonb NOT NULL DEFAULT '{}'::jsonb,
    state             executor_state NOT NULL DEFAULT 'live',
    -- SHA-256 of its credential; the credential itself is shown once.
    token_hash        bytea NOT NULL,
    -- Roles it reported running at its last heartbeat.
    reported          jsonb NOT NULL DEFAULT '[]'::jsonb,
    registered_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_heartbeat_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    state_changed_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX executors_state_idx ON executors (state);

-- The roles of each job at its current generation. Rewritten as a whole,
-- together with jobs.generation, in one transaction per membership change.
CREATE TABLE assignments (
    job_id       uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    generation   bigint NOT NULL,
    role         text NOT NULL CHECK (role IN ('ps', 'worker')),
    -- Shard number for a PS, rank for a worker.
    index        integer NOT NULL CHECK (index >= 0),
    executor_id  uuid NOT NULL REFERENCES executors (id),
    -- Device index of the job's device kind, for workers.
    device       integer,
    -- The tensor ranges a PS shard owns.
    ranges       jsonb NOT NULL DEFAULT '[]'::jsonb,
    PRIMARY KEY (job_id, role, index),
    CHECK ((role = 'worker') = (device IS NOT NULL))
);

CREATE INDEX assignments_executor_idx ON assignments (executor_id);
