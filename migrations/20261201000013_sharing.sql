-- Sharing a cluster: per-user quotas, the history of what each job held
-- (usage accounting and fair share), and preemptions in their grace period.

-- A user's limits on what its placed jobs hold at once. NULL is unlimited;
-- a user without a row is unlimited in everything.
CREATE TABLE quotas (
    owner        text PRIMARY KEY CHECK (owner ~ '^[a-z0-9][a-z0-9._-]{0,63}$'),
    cuda_devices integer CHECK (cuda_devices >= 0),
    cpu_workers  integer CHECK (cpu_workers >= 0),
    ps_ram_bytes bigint CHECK (ps_ram_bytes >= 0),
    updated_by   text NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- One row per generation of a job that held roles: what it held and from
-- when to when (ended_at NULL while it still holds them). Written in the
-- membership change's transaction, so the history is exactly the
-- assignments' timeline. Jobs keep their rows until they are deleted.
CREATE TABLE usage_intervals (
    id           bigserial PRIMARY KEY,
    job_id       uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    owner        text NOT NULL,
    generation   bigint NOT NULL,
    cuda_devices integer NOT NULL CHECK (cuda_devices >= 0),
    cpu_workers  integer NOT NULL CHECK (cpu_workers >= 0),
    ps_ram_bytes bigint NOT NULL CHECK (ps_ram_bytes >= 0),
    started_at   timestamptz NOT NULL,
    ended_at     timestamptz CHECK (ended_at >= started_at),
    UNIQUE (job_id, generation)
);
CREATE INDEX usage_intervals_open ON usage_intervals (job_id) WHERE ended_at IS NULL;
CREATE INDEX usage_intervals_owner_time ON usage_intervals (owner, started_at);
CREATE INDEX usage_intervals_time ON usage_intervals (started_at, ended_at);

-- A running job chosen to be preempted for a waiting job of higher
-- priority: released once it has committed a checkpoint after `decided_at`
-- or at `release_after` (the grace period), whichever comes first; called
-- off (the row deleted) when the preemptor no longer needs it.
CREATE TABLE preemptions (
    victim        uuid PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    preemptor     uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    decided_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    release_after timestamptz NOT NULL,
    CHECK (victim <> preemptor)
);
