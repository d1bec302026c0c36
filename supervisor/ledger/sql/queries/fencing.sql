-- name: committed_attempt_in_pool
-- Whether a step's attempt under a fence committed, the step being of a pool (its task's, or for a verify step its task's verifier pool).
SELECT 1 FROM attempts a JOIN steps s ON s.id = a.step_id JOIN tasks t ON t.id = s.task_id
WHERE a.step_id = :step_id AND a.fence = :fence AND a.state = :committed
    AND (CASE WHEN s.verifies IS NULL THEN t.pool ELSE t.verify_pool END) = :pool;

-- name: lease_step
-- Lease a step to a runner under a new fence and attempt, with its lease and acceptance deadlines.
UPDATE steps SET state = :state, attempt = :attempt, fence = :fence, runner_id = :runner_id,
    lease_deadline = :lease_deadline, accept_deadline = :accept_deadline
WHERE id = :step_id;

-- name: insert_attempt
-- Record a granted attempt, leased to a runner under its fence.
INSERT INTO attempts (step_id, attempt, fence, runner_id, token_id, state, granted_at)
VALUES (:step_id, :attempt, :fence, :runner_id, :token_id, :state, :now);

-- name: task_for_lease
-- What a lease carries of its task: state, tenant, pool and what its approval binds (the claim's rows hold the same).
SELECT state AS task_state, tenant, pool, repository, approved_base_sha, allowed_paths_json, checks_json,
    verify_pool
FROM tasks WHERE id = :task_id;

-- name: earlier_outputs
-- The outputs of a task's steps before a position, in order.
SELECT id, name, output_json FROM steps WHERE task_id = :task_id AND position < :position ORDER BY position;

-- name: lease_start_point
-- The candidate and bundle of a task's latest step before a position that reported one (a verify step reports none).
SELECT candidate_sha, bundle FROM steps
WHERE task_id = :task_id AND position < :position AND candidate_sha IS NOT NULL
ORDER BY position DESC LIMIT 1;

-- name: step_checkpoint
-- A step's latest accepted checkpoint, whole.
SELECT * FROM checkpoints WHERE step_id = :step_id;

-- name: step_with_task
-- A step with its task's state, tenant, the step's pool (its task's, or for a verify step its task's verifier pool), repository, approved base and verifier pool, and the runner token of its current attempt, if any.
SELECT s.*, t.state AS task_state, t.tenant,
    (CASE WHEN s.verifies IS NULL THEN t.pool ELSE t.verify_pool END) AS pool,
    t.repository, t.approved_base_sha, t.verify_pool, a.token_id AS lease_token_id
FROM steps s JOIN tasks t ON t.id = s.task_id LEFT JOIN attempts a ON a.fence = s.fence
WHERE s.id = :step_id;

-- name: set_attempt_usage
-- Record the usage counted for a step's attempt under a fence.
UPDATE attempts SET usage_json = :usage_json WHERE fence = :fence AND step_id = :step_id;

-- name: tenant_budget_spent
-- Whether a tenant has a token budget and has spent it.
SELECT 1 FROM tenants WHERE name = :tenant AND token_budget IS NOT NULL AND tokens_used >= token_budget;

-- name: extend_lease
-- Extend a step's lease to a new deadline; a renew also acknowledges it.
UPDATE steps SET lease_deadline = :lease_deadline, accept_deadline = NULL WHERE id = :step_id;

-- name: attempt_token
-- The runner token of the attempt under a fence.
SELECT token_id FROM attempts WHERE fence = :fence;

-- name: end_live_attempt
-- End a step's attempt under a fence with a state and reason, if it is still leased.
UPDATE attempts SET state = :state, reason = :reason, ended_at = :now
WHERE step_id = :step_id AND fence = :fence AND state = {AttemptState.LEASED};

-- name: set_step_burned
-- Record how many counted attempts a step has used.
UPDATE steps SET burned = :burned WHERE id = :step_id;

-- name: requeue_step
-- Put a step back in the queue; its fence, runner and deadlines are cleared.
UPDATE steps SET state = :state, burned = :burned, fence = NULL, runner_id = NULL,
    lease_deadline = NULL, accept_deadline = NULL
WHERE id = :step_id;

-- name: fail_step
-- Fail a step; its fence and deadlines are cleared.
UPDATE steps SET state = :state, fence = NULL, lease_deadline = NULL,
    accept_deadline = NULL
WHERE id = :step_id;

-- name: fail_live_attempts_of_task
-- Fail every still-leased attempt of a task's steps with a reason.
UPDATE attempts SET state = :failed, reason = :reason, ended_at = :now
WHERE state = :leased AND step_id IN (SELECT id FROM steps WHERE task_id = :task_id);

-- name: end_steps_of_failed_task
-- End a failed task's unfinished steps (not in the two states given): leased ones fail, the rest are cancelled; an effect step whose outbox row is in the last two states given (being sent, uncertain) keeps its state.
UPDATE steps SET state = CASE WHEN state = :leased THEN :failed ELSE :cancelled END,
    fence = NULL, lease_deadline = NULL, accept_deadline = NULL
WHERE task_id = :task_id AND state NOT IN (:committed, :failed)
    AND id NOT IN (SELECT step_id FROM outbox WHERE state IN (:sending, :uncertain));

-- name: held_step_with_task
-- `step_with_task`, with the fence, runner token and usage counted of the step's attempt under a given fence (NULL when the step never had that fence).
SELECT s.*, t.state AS task_state, t.tenant,
    (CASE WHEN s.verifies IS NULL THEN t.pool ELSE t.verify_pool END) AS pool,
    t.repository, t.approved_base_sha, t.verify_pool, a.token_id AS lease_token_id, h.fence AS held_fence, h.token_id AS held_token_id,
    h.usage_json AS held_usage_json
FROM steps s JOIN tasks t ON t.id = s.task_id LEFT JOIN attempts a ON a.fence = s.fence
    LEFT JOIN attempts h ON h.step_id = s.id AND h.fence = :fence
WHERE s.id = :step_id;
