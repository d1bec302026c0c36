-- name: record_artifact_owner
-- Record that a role and scope uploaded a digest's bytes; the first upload's row is kept.
INSERT INTO artifact_owners (digest, role, scope, size, token_id, created_at)
VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (digest, role, scope) DO NOTHING;

-- name: owners_of_artifact
-- Every role and scope that uploaded a digest, oldest first.
SELECT digest, role, scope, size, created_at FROM artifact_owners WHERE digest = ?
ORDER BY created_at, role, scope;
