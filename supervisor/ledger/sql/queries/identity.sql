-- Step identity (supervisor/ledger/identity.py): a task and its steps' intents, written once at
-- creation and found again by the idempotency key.

-- name: task_by_idempotency_key
-- The task a tenant's idempotency key already names, if any.
SELECT * FROM tasks WHERE tenant = :tenant AND idempotency_key = :idempotency_key;

-- name: next_created_order
-- The creation order the next task gets (1 for the first).
SELECT COALESCE(MAX(created_order), 0) + 1 AS n FROM tasks;

-- name: insert_task
-- Record a new task with its plan and declarations.
INSERT INTO tasks (id, tenant, idempotency_key, state, plan_hash, plan_json, repository,
                   declared_base_sha, requirement_revision, allowed_paths_json,
                   expected_checks_json, checks_json, owner, pool, verify_pool, created_order,
                   created_at)
VALUES (:task_id, :tenant, :idempotency_key, {TaskState.PLANNED}, :plan_hash, :plan_json, :repository, :declared_base_sha, :requirement_revision, :allowed_paths_json, :expected_checks_json, :checks_json, :owner, :pool, :verify_pool, :created_order, :now);

-- name: insert_planned_step
-- Record one step's intent (its id and payload hash), waiting for its turn.
INSERT INTO steps (id, task_id, position, task_order, name, kind, payload_json, payload_hash,
                   state)
VALUES (:step_id, :task_id, :position, :task_order, :name, :kind, :payload_json, :payload_hash, {StepState.WAITING});

-- name: insert_tenant
-- Make sure a tenant has its row (budget and usage), once.
INSERT INTO tenants (name) VALUES (:tenant) ON CONFLICT DO NOTHING;

-- name: tenant_verify_pool
-- A tenant's default verifier pool, if it has a row.
SELECT verify_pool FROM tenants WHERE name = :tenant;

-- name: insert_verify_step
-- Record a verify step's intent, queued for its task's verifier pool at once.
INSERT INTO steps (id, task_id, position, task_order, name, kind, payload_json, payload_hash,
                   state, verifies, bundle)
VALUES (:step_id, :task_id, :position, :task_order, :name, :kind, :payload_json, :payload_hash, {StepState.QUEUED}, :verifies, :bundle);

-- name: next_step_position
-- The position after a task's last step.
SELECT COALESCE(MAX(position), -1) + 1 AS n FROM steps WHERE task_id = :task_id;
