-- name: kinds_served
-- The step kinds announced by a pool's runners seen at or after a time.
SELECT DISTINCT k.kind FROM runners r, jsonb_array_elements_text(r.kinds_json::jsonb) AS k (kind)
WHERE r.pool = :pool AND r.last_seen >= :since;
