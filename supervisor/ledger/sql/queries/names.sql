-- name: tenant_name_held
-- Whether the ledger already holds a tenant name: an operator token's scope or a tenant's row.
SELECT 1 AS k FROM tokens WHERE scope = ? AND role = 'operator'
UNION ALL SELECT 1 FROM tenants WHERE name = ? LIMIT 1;

-- name: pool_name_held
-- Whether the ledger already holds a pool name: a runner token's scope or a task's pool.
SELECT 1 AS k FROM tokens WHERE scope = ? AND role = 'runner'
UNION ALL SELECT 1 FROM tasks WHERE pool = ? LIMIT 1;
