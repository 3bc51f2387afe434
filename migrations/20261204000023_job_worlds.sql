-- How many of a job's generations started roles (a placement with workers,
-- or a restart of the same world after a crash): its ranks' restart count
-- is this minus one (torchrun's TORCHELASTIC_RESTART_COUNT). A generation
-- that only released roles (the job waited for executors) is not one.
ALTER TABLE jobs ADD COLUMN worlds integer NOT NULL DEFAULT 0;
UPDATE jobs SET worlds = generation;
