-- Executors a job must not use any more: its watchdog found a role of it
-- stuck there, or straggling when the spec asks to leave stragglers out.
-- Only that job is kept off them (other jobs still use them: what one
-- user's job does cannot take an executor from another's); kept for the
-- job's life.
CREATE TABLE job_exclusions (
    job_id      uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    executor_id uuid NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('stuck', 'straggler')),
    reason      text NOT NULL,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, executor_id)
);
