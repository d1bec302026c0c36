-- name: next_fence
-- Take the next fencing token from the counter that only grows.
UPDATE counters SET value = value + 1 WHERE name = 'fence' RETURNING value;

-- name: claim_queued_steps
-- Queued steps, each with what a lease carries of its task (`task_for_lease`, its state as task_state), of the kinds given (a JSON array) of a pool (a verify step's is its task's verifier pool, and it goes to no runner token given that holds an attempt of another step of its task) in live tasks whose tenant has budget left, oldest task first.
-- INDEXED BY: left to itself, SQLite 3.40 starts from tasks by state and sorts every queued step
-- on each claim (9 ms at 10k queued); walking the queue index is flat.
SELECT s.*, t.state AS task_state, t.tenant, t.pool, t.repository, t.approved_base_sha,
    t.allowed_paths_json, t.checks_json, t.verify_pool
FROM steps s INDEXED BY steps_queued JOIN tasks t ON t.id = s.task_id
LEFT JOIN tenants b ON b.name = t.tenant
WHERE s.state = {StepState.QUEUED} AND t.state IN ({TaskState.QUEUED}, {TaskState.RUNNING})
    AND (CASE WHEN s.verifies IS NULL THEN t.pool ELSE t.verify_pool END) = :pool
    AND s.kind IN (SELECT value FROM json_each(:kinds))
    AND (b.token_budget IS NULL OR b.tokens_used < b.token_budget)
    AND (s.verifies IS NULL OR NOT EXISTS (
        SELECT 1 FROM attempts a JOIN steps m ON m.id = a.step_id
        WHERE m.task_id = s.task_id AND m.verifies IS NULL
            AND (a.token_id = :token_id OR a.token_id IS NULL)))
ORDER BY s.task_order, s.position LIMIT :capacity;

-- name: charge_tenant_tokens
-- Add tokens to a tenant's spent total, saturating at the ceiling given.
UPDATE tenants SET tokens_used = MIN(tokens_used + :spent, :ceiling) WHERE name = :tenant;
