-- Unique prefixes of task ids (prefixes.py).

-- name: tenant_task_ids_with_prefix
-- Up to a few of a tenant's task ids that begin with a prefix of the length given, by id.
SELECT id FROM tasks WHERE tenant = :tenant AND substr(id, 1, :length) = :prefix ORDER BY id LIMIT :limit;

-- name: task_ids_with_prefix
-- Up to a few task ids of any tenant that begin with a prefix of the length given, by id.
SELECT id FROM tasks WHERE substr(id, 1, :length) = :prefix ORDER BY id LIMIT :limit;
