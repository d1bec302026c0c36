-- name: refusal_task
-- The tenant and pool a recorded refusal's log line names.
SELECT tenant, pool FROM tasks WHERE id = :task_id;

-- name: refusal_attempt
-- The attempt, runner and token a recorded refusal's fence names, for its log line.
SELECT attempt, runner_id, token_id FROM attempts WHERE fence = :fence;
