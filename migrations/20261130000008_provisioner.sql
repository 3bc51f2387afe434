-- The provisioner: executors it started (so that only those are ever
-- stopped, and a new leader on the same host can take them back) and every
-- decision it made, with its reason.
CREATE TABLE provisioned_executors (
    name        text PRIMARY KEY,
    provisioner text NOT NULL,
    -- The machine that started it (adoption is per host).
    host        text NOT NULL,
    pid         integer,
    -- starting | running | stopping | stopped | exited | failed | gone
    state       text NOT NULL,
    -- Its id once it registered.
    executor_id uuid,
    reason      text,
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    stopped_at  timestamptz
);
CREATE INDEX provisioned_executors_state_idx ON provisioned_executors (provisioner, host, state);

CREATE TABLE provisioner_events (
    id            bigserial PRIMARY KEY,
    at            timestamptz NOT NULL DEFAULT clock_timestamp(),
    provisioner   text NOT NULL,
    -- start | release | stopped | exited | failed | blocked | adopted
    kind          text NOT NULL,
    executor_name text,
    job_id        uuid,
    reason        text NOT NULL,
    data          jsonb NOT NULL DEFAULT '{}'::jsonb
);
