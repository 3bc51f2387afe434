-- Checkpoints. A role reports each shard it has uploaded; once every shard
-- of one (step, generation) is in, the API writes manifest.json (the commit
-- point) and then the `checkpoints` row. Only committed checkpoints are
-- ever used; shard rows of a checkpoint that never completed are dropped
-- when a newer one commits.
CREATE TABLE checkpoint_shards (
    job_id      uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    step        bigint NOT NULL CHECK (step >= 0),
    generation  bigint NOT NULL,
    shard       integer NOT NULL CHECK (shard >= 0),
    shards      integer NOT NULL CHECK (shards > shard),
    report      jsonb NOT NULL,
    reported_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, step, generation, shard)
);

CREATE TABLE checkpoints (
    job_id       uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    step         bigint NOT NULL CHECK (step >= 0),
    generation   bigint NOT NULL,
    shards       integer NOT NULL CHECK (shards > 0),
    bytes        bigint NOT NULL CHECK (bytes >= 0),
    manifest_key text NOT NULL,
    manifest     jsonb NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, step)
);
