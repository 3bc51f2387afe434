-- What each training role of a job's current generation is doing, as its
-- executor's last heartbeat said: one row per worker rank, replaced by
-- every beat (only from the executor that holds that rank now). The stuck
-- check and the straggler figures read it; nothing else is kept of it.
CREATE TABLE role_progress (
    job_id          uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    rank            integer NOT NULL CHECK (rank >= 0),
    generation      bigint NOT NULL,
    executor_id     uuid NOT NULL,
    step            bigint NOT NULL CHECK (step >= 0),
    phase           text NOT NULL CHECK (phase IN ('setup', 'data', 'compute', 'comm', 'eval', 'checkpoint')),
    -- How long it had been in `phase` when the beat left the executor.
    phase_ms        bigint NOT NULL CHECK (phase_ms >= 0),
    median_step_ms  double precision NOT NULL CHECK (median_step_ms >= 0),
    busy_ms         double precision NOT NULL CHECK (busy_ms >= 0),
    window_steps    integer NOT NULL CHECK (window_steps >= 0),
    reported_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, rank)
);
