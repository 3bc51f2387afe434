-- A PS shard's hot standby is a role kind of its own: 'standby', numbered
-- by the shard it stands by for, instead of a 'ps' row numbered
-- 65536 + shard. (The API's JSON and the job logs keep naming it a `ps`
-- role numbered 65536 + shard; the code translates.)

ALTER TABLE assignments DROP CONSTRAINT assignments_role_check;
ALTER TABLE assignments
    ADD CONSTRAINT assignments_role_check CHECK (role IN ('ps', 'worker', 'standby'));

UPDATE assignments SET role = 'standby', index = index - 65536
    WHERE role = 'ps' AND index >= 65536;

-- The roles executors last reported are compared with the assignments
-- (a job runs once every role is reported): the same names.
UPDATE executors SET reported = (
    SELECT coalesce(jsonb_agg(
        CASE WHEN r->>'role' = 'ps' AND (r->>'index')::bigint >= 65536
             THEN r || jsonb_build_object('role', 'standby', 'index', (r->>'index')::bigint - 65536)
             ELSE r END), '[]'::jsonb)
    FROM jsonb_array_elements(reported) r)
WHERE jsonb_typeof(reported) = 'array' AND reported <> '[]'::jsonb;
