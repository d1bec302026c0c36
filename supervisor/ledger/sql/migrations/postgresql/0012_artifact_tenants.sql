-- Issue 23: the tenant each artifact was uploaded for, and the bytes a pool keeps
-- (sqlite/0012_artifact_tenants.sql says what each column holds, and how existing rows are
-- given their tenants).
ALTER TABLE artifact_owners ADD COLUMN tenant text NOT NULL DEFAULT '';
ALTER TABLE artifact_owners ADD COLUMN step_id text;
ALTER TABLE artifact_owners ALTER COLUMN tenant DROP DEFAULT;
UPDATE artifact_owners SET tenant = scope WHERE role = 'operator';
ALTER TABLE artifact_owners DROP CONSTRAINT artifact_owners_pkey;
ALTER TABLE artifact_owners ADD PRIMARY KEY (digest, role, scope, tenant);
INSERT INTO artifact_owners (digest, role, scope, tenant, step_id, size, token_id, created_at)
SELECT DISTINCT o.digest, o.role, o.scope, t.tenant, NULL::text, o.size, o.token_id, o.created_at
FROM artifact_owners o
JOIN (
    SELECT digest, step_id FROM artifacts
    UNION SELECT bundle, id FROM steps WHERE bundle IS NOT NULL
    UNION SELECT log_digest, step_id FROM check_runs
    UNION SELECT transcript, step_id FROM checkpoints
    UNION SELECT bundle, step_id FROM checkpoints WHERE bundle IS NOT NULL
) r ON r.digest = o.digest
JOIN steps s ON s.id = r.step_id
JOIN tasks t ON t.id = s.task_id AND t.pool = o.scope
WHERE o.role = 'runner' AND o.tenant = '';
DELETE FROM artifact_owners o
WHERE o.role = 'runner' AND o.tenant = '' AND EXISTS (
    SELECT 1 FROM artifact_owners n
    WHERE n.digest = o.digest AND n.role = o.role AND n.scope = o.scope AND n.tenant <> ''
);
CREATE INDEX artifact_owners_by_scope ON artifact_owners (role, scope);
CREATE INDEX artifact_owners_by_age ON artifact_owners (created_at);
-- What the collector looks up for each owner row: whether any step names its digest.
CREATE INDEX artifacts_by_digest ON artifacts (digest);
CREATE INDEX steps_by_bundle ON steps (bundle) WHERE bundle IS NOT NULL;
CREATE INDEX check_runs_by_log ON check_runs (log_digest);
CREATE INDEX checkpoints_by_transcript ON checkpoints (transcript);
CREATE INDEX checkpoints_by_bundle ON checkpoints (bundle) WHERE bundle IS NOT NULL;
