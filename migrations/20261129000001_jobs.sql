-- Jobs and their event log (the foundation schema).

-- Mirrors trainyard_common::JobState; the lifecycle's legal moves are checked
-- in Rust (JobState::can_move_to) by the one function that writes them.
CREATE TYPE job_state AS ENUM (
    'queued', 'inspecting', 'scheduling', 'running', 'recovering',
    'succeeded', 'failed', 'cancelled'
);

CREATE TABLE jobs (
    id              uuid PRIMARY KEY,
    name            text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 128),
    -- The validated spec exactly as the API serialized it.
    spec            jsonb NOT NULL,
    state           job_state NOT NULL DEFAULT 'queued',
    state_reason    text NOT NULL DEFAULT 'submitted',
    -- Fencing token of the job's membership; bumped with every new set of
    -- assignments (see ../shared/DESIGN.md, "Control plane").
    generation      bigint NOT NULL DEFAULT 0 CHECK (generation >= 0),
    -- A retried submit with the same key returns this job instead of a new
    -- one; the hash of the body tells a retry from a different request that
    -- reuses the key.
    idempotency_key text UNIQUE CHECK (char_length(idempotency_key) BETWEEN 1 AND 255),
    request_hash    bytea,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    started_at      timestamptz,
    finished_at     timestamptz,
    CHECK ((idempotency_key IS NULL) = (request_hash IS NULL)),
    -- Terminal jobs carry the time they ended, live ones do not.
    CHECK ((state IN ('succeeded', 'failed', 'cancelled')) = (finished_at IS NOT NULL))
);

-- Newest-first listing with keyset pagination, optionally by state.
CREATE INDEX jobs_created_idx ON jobs (created_at DESC, id DESC);
CREATE INDEX jobs_state_created_idx ON jobs (state, created_at DESC, id DESC);

CREATE TABLE job_events (
    id          bigserial PRIMARY KEY,
    job_id      uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    kind        text NOT NULL,
    -- A state change sets to_state (and from_state, except the submit that
    -- creates the job); other events (placements, checkpoints) set neither.
    from_state  job_state,
    to_state    job_state,
    reason      text NOT NULL,
    data        jsonb NOT NULL DEFAULT '{}'::jsonb,
    CHECK (from_state IS NULL OR to_state IS NOT NULL)
);

CREATE INDEX job_events_job_idx ON job_events (job_id, id);
