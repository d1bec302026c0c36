-- name: record_artifact_owner
-- Record that a role and scope uploaded a digest's bytes for a tenant; the first row is kept.
INSERT INTO artifact_owners (digest, role, scope, tenant, step_id, size, token_id, created_at)
VALUES (:digest, :role, :scope, :tenant, :step_id, :size, :token_id, :now) ON CONFLICT (digest, role, scope, tenant) DO NOTHING;

-- name: owners_of_artifact
-- Every role, scope and tenant a digest was uploaded by and for, oldest first.
SELECT digest, role, scope, tenant, size, created_at FROM artifact_owners WHERE digest = :digest
ORDER BY created_at, role, scope, tenant;

-- name: artifact_bytes_kept
-- The bytes of the distinct digests a role and scope uploaded, but one: what its quota counts
-- besides that digest's.
SELECT COALESCE(SUM(size), 0) AS kept FROM (
    SELECT digest, MAX(size) AS size FROM artifact_owners
    WHERE role = :role AND scope = :scope AND digest <> :besides
    GROUP BY digest
) AS kept_digests;

-- name: unreferenced_artifact_owners
-- Owner rows older than a time whose digest no step names (a result's artifact, bundle or
-- check log, a checkpoint) and whose step, if it has one, is not leased now.
SELECT o.digest, o.role, o.scope, o.tenant, o.size FROM artifact_owners o
WHERE o.created_at < :uploaded_before
  AND NOT EXISTS (SELECT 1 FROM artifacts a WHERE a.digest = o.digest)
  AND NOT EXISTS (SELECT 1 FROM steps s WHERE s.bundle = o.digest)
  AND NOT EXISTS (SELECT 1 FROM check_runs c WHERE c.log_digest = o.digest)
  AND NOT EXISTS (
      SELECT 1 FROM checkpoints k WHERE k.transcript = o.digest OR k.bundle = o.digest
  )
  AND NOT EXISTS (
      SELECT 1 FROM steps s WHERE s.id = o.step_id AND s.state = 'leased'
  )
ORDER BY o.created_at
LIMIT :limit;

-- name: forget_artifact_owner
-- Remove one owner row (the collector's).
DELETE FROM artifact_owners WHERE digest = :digest AND role = :role AND scope = :scope AND tenant = :tenant;

-- name: artifact_owned
-- Whether any owner row names a digest.
SELECT 1 AS owned FROM artifact_owners WHERE digest = :digest LIMIT 1;

-- name: bundle_verified_in_pool
-- Whether a digest is the candidate bundle of a verify step leased now to a runner of a pool: that pool's runner reads it.
SELECT 1 FROM steps s JOIN tasks t ON t.id = s.task_id
WHERE s.bundle = :bundle AND s.verifies IS NOT NULL AND s.state = {StepState.LEASED}
    AND t.verify_pool = :pool
LIMIT 1;
