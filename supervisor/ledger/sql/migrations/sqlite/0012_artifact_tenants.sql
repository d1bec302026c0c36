-- Issue 23: an artifact is read by the tenant it was uploaded for, and a pool's bytes are
-- counted against a quota (docs/design.md, Artifacts). Each owner row gains `tenant`: an
-- operator's own tenant; for a runner, the tenant of the task whose lease it uploaded for
-- (`step_id`), or '' when the upload named no lease (then only the pool's runners read it).
-- The columns come in PostgreSQL's order (its 0012 adds them to the end).
-- The key now holds the tenant, so the same bytes uploaded for two tenants' tasks are two
-- rows (counted once against the pool). Existing runner rows take the tenant of each task
-- whose steps named the digest (a result's artifact, bundle or check log, a checkpoint).
CREATE TABLE artifact_owners_by_tenant (
    digest     TEXT NOT NULL,
    role       TEXT NOT NULL,
    scope      TEXT NOT NULL,
    size       INTEGER NOT NULL,
    token_id   TEXT,
    created_at REAL NOT NULL,
    tenant     TEXT NOT NULL,
    step_id    TEXT,
    PRIMARY KEY (digest, role, scope, tenant)
) STRICT;
INSERT INTO artifact_owners_by_tenant
    (digest, role, scope, tenant, step_id, size, token_id, created_at)
SELECT o.digest, o.role, o.scope, o.scope, NULL, o.size, o.token_id, o.created_at
FROM artifact_owners o WHERE o.role = 'operator';
INSERT INTO artifact_owners_by_tenant
    (digest, role, scope, tenant, step_id, size, token_id, created_at)
SELECT DISTINCT o.digest, o.role, o.scope, t.tenant, NULL, o.size, o.token_id, o.created_at
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
WHERE o.role = 'runner';
INSERT INTO artifact_owners_by_tenant
    (digest, role, scope, tenant, step_id, size, token_id, created_at)
SELECT o.digest, o.role, o.scope, '', NULL, o.size, o.token_id, o.created_at
FROM artifact_owners o
WHERE o.role = 'runner' AND NOT EXISTS (
    SELECT 1 FROM artifact_owners_by_tenant n
    WHERE n.digest = o.digest AND n.role = o.role AND n.scope = o.scope
);
DROP TABLE artifact_owners;
ALTER TABLE artifact_owners_by_tenant RENAME TO artifact_owners;
CREATE INDEX artifact_owners_by_scope ON artifact_owners (role, scope);
CREATE INDEX artifact_owners_by_age ON artifact_owners (created_at);
-- What the collector looks up for each owner row: whether any step names its digest.
CREATE INDEX artifacts_by_digest ON artifacts (digest);
CREATE INDEX steps_by_bundle ON steps (bundle) WHERE bundle IS NOT NULL;
CREATE INDEX check_runs_by_log ON check_runs (log_digest);
CREATE INDEX checkpoints_by_transcript ON checkpoints (transcript);
CREATE INDEX checkpoints_by_bundle ON checkpoints (bundle) WHERE bundle IS NOT NULL;
