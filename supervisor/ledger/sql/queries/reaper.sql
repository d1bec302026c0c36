-- name: leases_to_reap
-- Leased steps past their lease deadline or acceptance window, with their task's state, tenant and the step's pool.
SELECT s.*, t.state AS task_state, t.tenant,
    (CASE WHEN s.verifies IS NULL THEN t.pool ELSE t.verify_pool END) AS pool FROM steps s
JOIN tasks t ON t.id = s.task_id
WHERE s.state = {StepState.LEASED} AND (s.lease_deadline <= :now OR s.accept_deadline <= :now);

-- name: next_lease_deadline
-- The earliest moment a lease lapses: its lease deadline or its acceptance window, as d.
SELECT CASE WHEN MIN(accept_deadline) < MIN(lease_deadline) THEN MIN(accept_deadline)
    ELSE MIN(lease_deadline) END AS d
FROM steps WHERE state = {StepState.LEASED};

-- name: refresh_leases
-- Give every open lease a new lease deadline, and a new acceptance window if not yet acknowledged.
UPDATE steps SET lease_deadline = :lease_deadline,
    accept_deadline = CASE WHEN accept_deadline IS NULL THEN NULL ELSE CAST(:accept_deadline AS double precision) END
WHERE state = {StepState.LEASED};

-- name: extend_leases
-- Move every open lease's deadline, and its acceptance window if not yet acknowledged, later by the seconds given.
UPDATE steps SET lease_deadline = lease_deadline + CAST(:unattended AS double precision),
    accept_deadline = accept_deadline + CAST(:unattended AS double precision)
WHERE state = {StepState.LEASED};

-- name: stamp_alive
-- Record that a supervisor serves this ledger at the moment given (microseconds): the counter 'alive'.
INSERT INTO counters (name, value) VALUES ('alive', :alive)
ON CONFLICT (name) DO UPDATE SET value = excluded.value;

-- name: last_alive
-- The last moment a supervisor was known to serve this ledger (microseconds), if any ever stamped it.
SELECT value FROM counters WHERE name = 'alive';
