-- Experiment tracking (api/src/tracking): a job's export to an MLflow
-- tracking server, and the warning event of an export that cannot reach it.
ALTER TYPE event_kind ADD VALUE IF NOT EXISTS 'tracking';

-- One row per job that is logged to MLflow, written at submit with the
-- resolved server and experiment. It is the exporter's cursor: the run it
-- made, the last step of rank 0 sent, what is done, and when to try next.
-- The exporter holds a row locked (FOR UPDATE SKIP LOCKED) while it
-- exports, so one API replica at a time exports a job, and a restarted
-- server resumes where the row says.
CREATE TABLE tracking_exports (
    job_id         uuid PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    uri            text NOT NULL CHECK (char_length(uri) BETWEEN 1 AND 1024),
    experiment     text NOT NULL CHECK (char_length(experiment) BETWEEN 1 AND 250),
    experiment_id  text,
    run_id         text,
    artifact_uri   text,
    -- Rank 0's steps up to this one are sent.
    exported_step  bigint NOT NULL DEFAULT 0 CHECK (exported_step >= 0),
    params_done    boolean NOT NULL DEFAULT false,
    -- Nothing more to send: the run has its end status (or was given up).
    finished       boolean NOT NULL DEFAULT false,
    -- Failed tries in a row, and the backoff's next try.
    failures       integer NOT NULL DEFAULT 0 CHECK (failures >= 0),
    next_try       timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_error     text,
    -- Whether the job has its `tracking` warning for the current outage.
    warned         boolean NOT NULL DEFAULT false,
    updated_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK ((run_id IS NULL) = (experiment_id IS NULL))
);

CREATE INDEX tracking_exports_due_idx ON tracking_exports (next_try) WHERE NOT finished;
