-- Parameter-server workers' view of consistency: the largest staleness of
-- the step's accepted pushes (versions the shard moved on since the pull)
-- and how many of its pushes were rejected as too stale.
ALTER TABLE job_metrics ADD COLUMN staleness integer CHECK (staleness >= 0);
ALTER TABLE job_metrics ADD COLUMN rejected integer NOT NULL DEFAULT 0 CHECK (rejected >= 0);
