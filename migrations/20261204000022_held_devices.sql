-- Devices an executor's stopped roles still hold (their sandboxed model
-- process has not exited), as its last heartbeat listed them
-- (trainyard_common::cluster::HeldDevice): the planner places no other job
-- on them.
ALTER TABLE executors ADD COLUMN held jsonb NOT NULL DEFAULT '[]';
