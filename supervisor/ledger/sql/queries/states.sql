-- name: task_state
-- The state a task is in now.
SELECT state FROM tasks WHERE id = :task_id;

-- name: move_task
-- Move a task to a state that stamps nothing; a reason given replaces the one held.
UPDATE tasks SET state = :state, reason = COALESCE(:reason, reason) WHERE id = :task_id;

-- name: move_task_approving
-- Move a task to APPROVED, stamping approved_at the first time.
UPDATE tasks SET state = :state, reason = COALESCE(:reason, reason), approved_at = COALESCE(approved_at, :now)
WHERE id = :task_id;

-- name: move_task_starting
-- Move a task to RUNNING, stamping started_at the first time.
UPDATE tasks SET state = :state, reason = COALESCE(:reason, reason), started_at = COALESCE(started_at, :now)
WHERE id = :task_id;

-- name: move_task_finishing
-- Move a task to an end state, stamping finished_at the first time.
UPDATE tasks SET state = :state, reason = COALESCE(:reason, reason), finished_at = COALESCE(finished_at, :now)
WHERE id = :task_id;
