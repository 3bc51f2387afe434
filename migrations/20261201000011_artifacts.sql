-- Users' uploaded files. Every upload is a version (its bytes live at
-- `key` in the object store, under `artifacts/<owner>/`); `artifacts` maps
-- a user's name to its current version. A replaced or deleted version
-- stays (superseded) while an unfinished job still reads it, and is swept
-- once none does.
CREATE TABLE artifact_versions (
    id            uuid PRIMARY KEY,
    owner         text NOT NULL,
    name          text NOT NULL,
    size          bigint NOT NULL CHECK (size >= 0),
    sha256        text NOT NULL,
    key           text NOT NULL UNIQUE,
    created_at    timestamptz NOT NULL DEFAULT now(),
    superseded_at timestamptz
);
CREATE INDEX artifact_versions_owner ON artifact_versions (owner);
CREATE INDEX artifact_versions_superseded ON artifact_versions (superseded_at)
    WHERE superseded_at IS NOT NULL;

CREATE TABLE artifacts (
    owner   text NOT NULL,
    name    text NOT NULL,
    version uuid NOT NULL UNIQUE REFERENCES artifact_versions (id),
    PRIMARY KEY (owner, name)
);

-- What a job may read, fixed at submit (trainyard_common::artifact::DataPolicy):
-- its resolved artifacts, the allowed prefixes, the store it may not read.
-- NULL for jobs submitted before artifacts existed: they read as admins'.
ALTER TABLE jobs ADD COLUMN data_policy jsonb;
-- Which artifact versions unfinished jobs read.
CREATE TABLE job_artifacts (
    job_id  uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    version uuid NOT NULL REFERENCES artifact_versions (id),
    PRIMARY KEY (job_id, version)
);
CREATE INDEX job_artifacts_version ON job_artifacts (version);
