-- name: next_fence
-- Take the next fencing token from the sequence that only grows.
SELECT nextval('fences') AS value;

-- name: claim_queued_steps
-- Queued steps of the kinds given (a JSON array) in a pool's live tasks whose tenant has budget left, oldest task first, each row locked; a step another transaction holds is skipped. Under the writer's advisory lock nothing is ever skipped: the row lock keeps two writers that ever ran without it (a future change, a manual session) from granting one step twice.
SELECT s.* FROM steps s JOIN tasks t ON t.id = s.task_id
LEFT JOIN tenants b ON b.name = t.tenant
WHERE s.state = {StepState.QUEUED} AND t.state IN ({TaskState.QUEUED}, {TaskState.RUNNING})
    AND t.pool = ? AND s.kind IN (SELECT jsonb_array_elements_text(?::jsonb))
    AND (b.token_budget IS NULL OR b.tokens_used < b.token_budget)
ORDER BY s.task_order, s.position LIMIT ?
FOR UPDATE OF s SKIP LOCKED;

-- name: charge_tenant_tokens
-- Add tokens to a tenant's spent total, saturating at the ceiling given.
UPDATE tenants SET tokens_used = LEAST(tokens_used + ?, ?) WHERE name = ?;
