-- name: kinds_served
-- The step kinds announced by a pool's runners seen at or after a time.
SELECT DISTINCT k.value AS kind FROM runners r, json_each(r.kinds_json) k
WHERE r.pool = :pool AND r.last_seen >= :since;
