-- Bytes a rank sent on the data plane in a step (the ring's gradient
-- traffic; a PS worker's pushes and pulls), so the metrics API can report
-- bus bandwidth beside communication time.
ALTER TABLE job_metrics ADD COLUMN comm_bytes bigint NOT NULL DEFAULT 0 CHECK (comm_bytes >= 0);
