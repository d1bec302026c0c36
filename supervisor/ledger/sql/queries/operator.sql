-- name: owned_task
-- A task's row, if it is the tenant's: another tenant's task is not found.
SELECT * FROM tasks WHERE id = :task_id AND tenant = :tenant;

-- name: set_approved_base
-- Bind the base SHA an approval names.
UPDATE tasks SET approved_base_sha = :approved_base_sha WHERE id = :task_id;

-- name: cancel_live_attempts_of_task
-- End every attempt of a cancelled task's steps still in the second state given, in the first.
UPDATE attempts SET state = :cancelled, reason = 'task cancelled', ended_at = :now
WHERE state = :leased AND step_id IN (SELECT id FROM steps WHERE task_id = :task_id);

-- name: cancel_steps_of_task
-- Move a cancelled task's unfinished steps (not in the two states given) to the first state given, but an effect step whose outbox row is in the last two (being sent, uncertain).
UPDATE steps SET state = :cancelled, lease_deadline = NULL, accept_deadline = NULL
WHERE task_id = :task_id AND state NOT IN (:committed, :failed)
    AND id NOT IN (SELECT step_id FROM outbox WHERE state IN (:sending, :uncertain));

-- name: set_repository_head
-- Record a tenant's repository's head as observed now.
INSERT INTO repositories (tenant, name, head_sha, updated_at) VALUES (:tenant, :repository, :head_sha, :now)
ON CONFLICT (tenant, name) DO UPDATE SET head_sha = excluded.head_sha,
    updated_at = excluded.updated_at;

-- name: live_tasks_of_repository
-- Every task of a tenant's repository that has not ended, oldest first.
SELECT * FROM tasks WHERE tenant = :tenant AND repository = :repository
AND state NOT IN ({TaskState.SUCCEEDED}, {TaskState.FAILED}, {TaskState.CANCELLED})
ORDER BY created_order;

-- name: set_tenant_budget
-- Set a tenant's token budget (null: none), creating its row if need be.
INSERT INTO tenants (name, token_budget) VALUES (:tenant, :tokens)
ON CONFLICT (name) DO UPDATE SET token_budget = excluded.token_budget;

-- name: tenant_spending
-- A tenant's token budget and the tokens its attempts spent.
SELECT token_budget, tokens_used FROM tenants WHERE name = :tenant;

-- name: tenant_has_operator_token
-- Whether an operator token was ever made for a tenant (one without a tenants row).
SELECT 1 FROM tokens WHERE scope = :tenant AND role = 'operator';

-- name: all_tenant_spending
-- Every tenant the ledger holds a row for, by name, with its budget and tokens spent.
SELECT name, token_budget, tokens_used FROM tenants ORDER BY name;

-- name: set_reviewer_decision
-- Record the reviewer's decision on a task.
UPDATE tasks SET reviewer_decision = :reviewer_decision WHERE id = :task_id;

-- name: set_tenant_verify_pool
-- Set a tenant's default verifier pool (null: none), creating its row if need be.
INSERT INTO tenants (name, verify_pool) VALUES (:tenant, :pool)
ON CONFLICT (name) DO UPDATE SET verify_pool = excluded.verify_pool;
