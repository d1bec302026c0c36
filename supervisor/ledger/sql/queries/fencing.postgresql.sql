-- name: next_fence
-- Take the next fencing token from the sequence that only grows.
SELECT nextval('fences') AS value;

-- name: claim_queued_steps
-- Queued steps, each with what a lease carries of its task (`task_for_lease`, its state as task_state), of the kinds given (a JSON array) of a pool (a verify step's is its task's verifier pool, and it goes to no runner token given that holds an attempt of another step of its task) in live tasks whose tenant has budget left, oldest task first, each row locked; a step another transaction holds is skipped. Under the writer's advisory lock nothing is ever skipped: the row lock keeps two writers that ever ran without it (a future change, a manual session) from granting one step twice.
SELECT s.*, t.state AS task_state, t.tenant, t.pool, t.repository, t.approved_base_sha,
    t.allowed_paths_json, t.checks_json, t.verify_pool
FROM steps s JOIN tasks t ON t.id = s.task_id
LEFT JOIN tenants b ON b.name = t.tenant
WHERE s.state = {StepState.QUEUED} AND t.state IN ({TaskState.QUEUED}, {TaskState.RUNNING})
    AND (CASE WHEN s.verifies IS NULL THEN t.pool ELSE t.verify_pool END) = :pool
    AND s.kind IN (SELECT jsonb_array_elements_text(:kinds::jsonb))
    AND (b.token_budget IS NULL OR b.tokens_used < b.token_budget)
    AND (s.verifies IS NULL OR NOT EXISTS (
        SELECT 1 FROM attempts a JOIN steps m ON m.id = a.step_id
        WHERE m.task_id = s.task_id AND m.verifies IS NULL
            AND (a.token_id = :token_id OR a.token_id IS NULL)))
ORDER BY s.task_order, s.position LIMIT :capacity
FOR UPDATE OF s SKIP LOCKED;

-- name: charge_tenant_tokens
-- Add tokens to a tenant's spent total, saturating at the ceiling given.
UPDATE tenants SET tokens_used = LEAST(tokens_used + :spent, :ceiling) WHERE name = :tenant;

-- name: grant_lease
-- Take the next fencing token, lease a step to a runner under it with its deadlines and record the attempt, in one statement (SQLite: next_fence, lease_step, insert_attempt); the fence.
WITH taken AS (SELECT nextval('fences') AS fence),
leased AS (
    UPDATE steps SET state = {StepState.LEASED}, attempt = :attempt,
        fence = (SELECT fence FROM taken), runner_id = :runner_id,
        lease_deadline = :lease_deadline, accept_deadline = :accept_deadline
    WHERE id = :step_id
),
recorded AS (
    INSERT INTO attempts (step_id, attempt, fence, runner_id, token_id, state, granted_at)
    VALUES (:step_id, :attempt, (SELECT fence FROM taken), :runner_id, :token_id,
        {AttemptState.LEASED}, :now)
)
SELECT fence AS value FROM taken;

-- name: count_usage
-- Record the usage counted for a step's attempt under a fence and add its tokens to the tenant's spent total, saturating at the ceiling given, in one statement (SQLite: set_attempt_usage, charge_tenant_tokens).
WITH counted AS (
    UPDATE attempts SET usage_json = :usage_json WHERE fence = :fence AND step_id = :step_id
)
UPDATE tenants SET tokens_used = LEAST(tokens_used + :spent, :ceiling) WHERE name = :tenant;
