-- name: ready_effects
-- Rows ready to take (two states: `due`, `open`) from a time, of tasks not ended (three states), oldest first, up to a limit.
SELECT o.*, t.state AS task_state, t.tenant
FROM outbox o INDEXED BY outbox_ready JOIN tasks t ON t.id = o.task_id
WHERE o.state IN (:due, :open) AND o.not_before <= :now AND t.state NOT IN (:succeeded, :failed, :cancelled)
ORDER BY o.created_at
LIMIT :room;
