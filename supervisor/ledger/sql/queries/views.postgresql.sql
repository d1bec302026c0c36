-- name: runners_last_seen
-- When a pool's runners last claimed: any of them, and those announcing a kind.
SELECT MAX(last_seen) AS any_kind,
    MAX(CASE WHEN EXISTS (SELECT 1 FROM jsonb_array_elements_text(kinds_json::jsonb) AS k (kind)
        WHERE k.kind = :kind) THEN last_seen END) AS this_kind
FROM runners WHERE pool = :pool;
