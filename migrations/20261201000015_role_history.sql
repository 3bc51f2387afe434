-- Every role an executor has held, generation by generation. `assignments`
-- keeps only the current generation; this keeps them all, so that a role
-- report (metrics, log lines, checkpoint shards) is accepted only from the
-- executor that held the role it names in the generation it names, long
-- after that generation has been replaced (a late report of a survivor) and
-- never from an executor that held no such role (a stranger, or a zombie
-- claiming a generation it was not part of).
CREATE TABLE role_history (
    job_id      uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    generation  bigint NOT NULL,
    role        text NOT NULL,
    index       integer NOT NULL,
    executor_id uuid NOT NULL,
    assigned_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, generation, role, index)
);

CREATE INDEX role_history_holder_idx ON role_history (job_id, executor_id, generation);

-- Filled by the database itself, whatever writes `assignments`: every
-- membership change deletes a job's rows and inserts the next
-- generation's, so an insert is the whole history.
CREATE FUNCTION record_role_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO role_history (job_id, generation, role, index, executor_id)
    VALUES (NEW.job_id, NEW.generation, NEW.role, NEW.index, NEW.executor_id)
    ON CONFLICT (job_id, generation, role, index) DO UPDATE SET executor_id = EXCLUDED.executor_id;
    RETURN NEW;
END;
$$;

CREATE TRIGGER assignments_history AFTER INSERT OR UPDATE OF executor_id, generation ON assignments
    FOR EACH ROW EXECUTE FUNCTION record_role_history();

-- What was assigned before this migration is the only history known.
INSERT INTO role_history (job_id, generation, role, index, executor_id)
SELECT job_id, generation, role, index, executor_id FROM assignments
ON CONFLICT DO NOTHING;

-- A checkpoint shard belongs to the executor that reported it first: a
-- retry of that executor may update it, no other executor may.
ALTER TABLE checkpoint_shards ADD COLUMN executor_id uuid;

-- The generation that measured a metric point: when a step is measured
-- again by a newer generation (resumed from a checkpoint before it), the
-- newer one is kept; an older one never replaces a newer one.
ALTER TABLE job_metrics ADD COLUMN generation bigint NOT NULL DEFAULT 0;
