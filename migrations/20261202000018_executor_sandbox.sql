-- How each executor confines users' code, as it said at registration
-- ({"state": "confined" | "unconfined" | "unavailable", "detail": ...});
-- NULL for executors from before sandboxes. The scheduler never makes an
-- executor whose sandbox is unavailable a model's inspector.
ALTER TABLE executors ADD COLUMN sandbox jsonb;
