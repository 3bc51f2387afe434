-- Hyperparameter sweeps: a base spec, a search space and ASHA's rungs
-- (the spec), their trials (each a job once submitted), and the times a
-- surviving trial grew onto executors a stopped trial freed.
CREATE TABLE sweeps (
    id          uuid PRIMARY KEY,
    name        text NOT NULL,
    owner       text NOT NULL,
    -- Whether the owner was an admin when it was made: its trials are
    -- submitted with the data policy the owner had then.
    owner_admin boolean NOT NULL DEFAULT false,
    spec        jsonb NOT NULL,
    -- How many ASHA rungs it has (0 without early stopping): a trial grows
    -- only once it passed them all (the scheduler's cap).
    rungs       integer NOT NULL DEFAULT 0,
    state       text NOT NULL DEFAULT 'running'
                CHECK (state IN ('running', 'succeeded', 'failed', 'cancelled')),
    reason      text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz
);
CREATE INDEX sweeps_owner_idx ON sweeps (owner, created_at DESC);
CREATE INDEX sweeps_running_idx ON sweeps (created_at) WHERE state = 'running';

CREATE TABLE sweep_trials (
    sweep_id     uuid NOT NULL REFERENCES sweeps (id) ON DELETE CASCADE,
    index        integer NOT NULL CHECK (index >= 0),
    params       jsonb NOT NULL,
    -- The trial's checked job spec.
    spec         jsonb NOT NULL,
    job_id       uuid REFERENCES jobs (id) ON DELETE SET NULL,
    state        text NOT NULL DEFAULT 'pending'
                 CHECK (state IN ('pending', 'running', 'stopped', 'completed', 'failed', 'cancelled')),
    rung_metrics float8[] NOT NULL DEFAULT '{}',
    metric       float8,
    step         bigint,
    workers      integer NOT NULL DEFAULT 0,
    -- Executors its workers were on when last seen (growth is told by
    -- a survivor's new executors that a stopped trial had).
    executors    uuid[] NOT NULL DEFAULT '{}',
    -- What a stopped trial held when ASHA stopped it.
    freed        uuid[] NOT NULL DEFAULT '{}',
    reason       text,
    PRIMARY KEY (sweep_id, index)
);

CREATE TABLE sweep_growths (
    id             bigserial PRIMARY KEY,
    sweep_id       uuid NOT NULL REFERENCES sweeps (id) ON DELETE CASCADE,
    trial          integer NOT NULL,
    from_trial     integer NOT NULL,
    workers_before integer NOT NULL,
    workers_after  integer NOT NULL,
    at             timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX sweep_growths_sweep_idx ON sweep_growths (sweep_id, id);

ALTER TABLE jobs ADD COLUMN sweep_id uuid REFERENCES sweeps (id) ON DELETE SET NULL,
                 ADD COLUMN sweep_trial integer;
CREATE INDEX jobs_sweep_idx ON jobs (sweep_id) WHERE sweep_id IS NOT NULL;
