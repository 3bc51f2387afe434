-- Training metrics and role logs, kept after executors are gone.

CREATE TABLE job_metrics (
    job_id          uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    -- Worker rank that measured the step.
    rank            integer NOT NULL CHECK (rank >= 0),
    step            bigint NOT NULL CHECK (step >= 1),
    at              timestamptz NOT NULL DEFAULT clock_timestamp(),
    loss            double precision NOT NULL,
    lr              double precision NOT NULL,
    samples_per_sec double precision NOT NULL,
    data_seconds    double precision NOT NULL,
    compute_seconds double precision NOT NULL,
    comm_seconds    double precision NOT NULL,
    eval_loss       double precision,
    eval_accuracy   double precision,
    -- A retried report inserts nothing twice.
    PRIMARY KEY (job_id, rank, step)
);

CREATE TABLE job_logs (
    id          bigserial PRIMARY KEY,
    job_id      uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    executor_id uuid NOT NULL REFERENCES executors (id),
    generation  bigint NOT NULL,
    role        text NOT NULL CHECK (role IN ('ps', 'worker')),
    index       integer NOT NULL,
    -- Sequence number within one role instance: retries are idempotent.
    seq         bigint NOT NULL,
    at          timestamptz NOT NULL,
    level       text NOT NULL CHECK (level IN ('info', 'warn', 'error')),
    message     text NOT NULL CHECK (char_length(message) <= 4096),
    UNIQUE (job_id, executor_id, generation, role, index, seq)
);

CREATE INDEX job_logs_job_idx ON job_logs (job_id, id);
