-- API tokens with roles, job ownership, and per-user idempotency keys.

-- A bearer token of a user (`role = 'user'`: its own jobs only) or of an
-- admin (tokens, executors, every job). Only the SHA-256 of the token is
-- kept (tokens are 256 random bits, so a fast hash is enough); the token
-- itself is shown once, when it is made.
CREATE TABLE api_tokens (
    id          uuid PRIMARY KEY,
    -- The user the token acts as; jobs it submits belong to this name.
    owner       text NOT NULL CHECK (owner ~ '^[a-z0-9][a-z0-9._-]{0,63}$'),
    role        text NOT NULL CHECK (role IN ('admin', 'user')),
    -- What the token is for (free text, shown in listings).
    label       text NOT NULL DEFAULT '' CHECK (char_length(label) <= 128),
    token_hash  bytea NOT NULL UNIQUE,
    created_by  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at  timestamptz,
    revoked_at  timestamptz
);

-- The user a job belongs to. Jobs from before authentication existed, and
-- those submitted with the bootstrap admin token, belong to `admin`.
ALTER TABLE jobs ADD COLUMN owner text NOT NULL DEFAULT 'admin';

-- An idempotency key is the submitter's own: two users may use the same
-- key without seeing each other's jobs.
ALTER TABLE jobs DROP CONSTRAINT jobs_idempotency_key_key;
ALTER TABLE jobs ADD CONSTRAINT jobs_owner_idempotency_key_key UNIQUE (owner, idempotency_key);

-- A user's listing, newest first, and the per-user cap on waiting jobs.
CREATE INDEX jobs_owner_created_idx ON jobs (owner, created_at DESC, id DESC);
CREATE INDEX jobs_owner_waiting_idx ON jobs (owner)
    WHERE state IN ('queued', 'inspecting', 'scheduling');
