-- name: tenant_name_held
-- Whether the ledger already holds a tenant name: an operator token's scope or a tenant's row.
SELECT 1 AS k FROM tokens WHERE scope = :name AND role = 'operator'
UNION ALL SELECT 1 FROM tenants WHERE name = :name LIMIT 1;

-- name: pool_name_held
-- Whether the ledger already holds a pool name: a runner token's scope or a task's pool.
SELECT 1 AS k FROM tokens WHERE scope = :name AND role = 'runner'
UNION ALL SELECT 1 FROM tasks WHERE pool = :name LIMIT 1;
