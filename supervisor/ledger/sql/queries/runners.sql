-- name: record_runner_seen
-- Record a runner's claim in its pool; the row is written only when its token or kinds changed or its last_seen is older than the resolution given.
INSERT INTO runners (pool, runner_id, token_id, kinds_json, first_seen, last_seen)
VALUES (:pool, :runner_id, :token_id, :kinds_json, :now, :now)
ON CONFLICT (pool, runner_id) DO UPDATE SET token_id = excluded.token_id,
    kinds_json = excluded.kinds_json, last_seen = excluded.last_seen
WHERE runners.token_id IS DISTINCT FROM excluded.token_id
    OR runners.kinds_json IS DISTINCT FROM excluded.kinds_json
    OR runners.last_seen <= excluded.last_seen - :resolution;
