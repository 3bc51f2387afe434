-- An executor's cache of script jobs' Python environments, as its last
-- heartbeat listed it (trainyard_common::cluster::EnvironmentCache).
ALTER TABLE executors ADD COLUMN environments jsonb;
