-- Read models (views.py): the task view, listings, pools' queues, the journal, the review record.

-- name: operator_word_awaited
-- A task's first effect, by position, in either outbox state given (gated, uncertain): it waits for an operator.
SELECT s.name, o.state, o.digest FROM outbox o JOIN steps s ON s.id = o.step_id
WHERE o.task_id = :task_id AND o.state IN (:gated, :uncertain) ORDER BY s.position LIMIT 1;

-- name: next_step_in_line
-- A task's first step, by position, in either state given (queued, leased).
SELECT kind, state FROM steps WHERE task_id = :task_id AND state IN (:queued, :leased) ORDER BY position LIMIT 1;

-- name: steps_of_task_view
-- A task's steps in order, with the state of its task and the key of each one's effect.
SELECT s.*, t.state AS task_state, e.effect_key FROM steps s
JOIN tasks t ON t.id = s.task_id LEFT JOIN effects e ON e.step_id = s.id
WHERE s.task_id = :task_id ORDER BY s.position;

-- name: attempts_of_task
-- Every attempt of a task's steps, by step and attempt number.
SELECT a.* FROM attempts a JOIN steps s ON s.id = a.step_id WHERE s.task_id = :task_id
ORDER BY a.step_id, a.attempt;

-- name: check_runs_of_task
-- Every check run reported for a task's steps, by step and check name.
SELECT c.* FROM check_runs c JOIN steps s ON s.id = c.step_id WHERE s.task_id = :task_id
ORDER BY c.step_id, c.name;

-- name: checkpoints_of_task
-- The checkpoint each of a task's steps holds (turn and fence).
SELECT k.step_id, k.turn, k.fence FROM checkpoints k JOIN steps s ON s.id = k.step_id
WHERE s.task_id = :task_id;

-- name: rejections_of_task
-- The rejections recorded against a task's attempts, oldest first.
SELECT * FROM rejections WHERE task_id = :task_id ORDER BY id;

-- name: deliveries_of_task
-- Every delivery attempt of a task's effects, by step and attempt.
SELECT d.* FROM deliveries d JOIN outbox o ON o.step_id = d.step_id WHERE o.task_id = :task_id
ORDER BY d.step_id, d.attempt;

-- name: effect_decisions_of_task
-- Operators' words on a task's effects (gate openings, happened or not), oldest first.
SELECT a.* FROM effect_decisions a JOIN outbox o ON o.step_id = a.step_id WHERE o.task_id = :task_id
ORDER BY a.id;

-- name: outbox_of_task
-- A task's effects as the outbox holds them.
SELECT * FROM outbox WHERE task_id = :task_id;

-- name: tenant_tasks_page
-- A page of a tenant's tasks, newest first, before a cursor (null: from the newest), with their steps in all and committed (the state given).
SELECT t.*, (SELECT COUNT(*) FROM steps s WHERE s.task_id = t.id) AS steps_total,
    (SELECT COUNT(*) FROM steps s WHERE s.task_id = t.id AND s.state = :committed) AS steps_committed
FROM tasks t
WHERE t.tenant = :tenant AND t.created_order < COALESCE(:cursor, 9223372036854775807)
ORDER BY t.created_order DESC LIMIT :limit;

-- name: tenant_tasks_in_state_page
-- As tenant_tasks_page, only the tasks in one state.
SELECT t.*, (SELECT COUNT(*) FROM steps s WHERE s.task_id = t.id) AS steps_total,
    (SELECT COUNT(*) FROM steps s WHERE s.task_id = t.id AND s.state = :committed) AS steps_committed
FROM tasks t
WHERE t.tenant = :tenant AND t.state = :state AND t.created_order < COALESCE(:cursor, 9223372036854775807)
ORDER BY t.created_order DESC LIMIT :limit;

-- name: tenant_tasks_search_page
-- As tenant_tasks_page, narrowed by whichever of state, id prefix or whole idempotency key, repository and pool are given (null: any).
SELECT t.*, (SELECT COUNT(*) FROM steps s WHERE s.task_id = t.id) AS steps_total,
    (SELECT COUNT(*) FROM steps s WHERE s.task_id = t.id AND s.state = :committed) AS steps_committed
FROM tasks t
WHERE t.tenant = :tenant AND t.created_order < COALESCE(:cursor, 9223372036854775807)
    AND (CAST(:state AS TEXT) IS NULL OR t.state = :state)
    AND (CAST(:id_prefix AS TEXT) IS NULL OR substr(t.id, 1, length(CAST(:id_prefix AS TEXT))) = :id_prefix
        OR t.idempotency_key = :text)
    AND (CAST(:repository AS TEXT) IS NULL OR t.repository = :repository)
    AND (CAST(:pool AS TEXT) IS NULL OR t.pool = :pool)
ORDER BY t.created_order DESC LIMIT :limit;

-- name: events_after
-- A task's journal after a sequence number, in order, at most so many.
SELECT * FROM events WHERE task_id = :task_id AND seq > :after ORDER BY seq LIMIT :limit;

-- name: attempts_by_state_of_task
-- How many of a task's attempts ended in each state (or are still leased).
SELECT a.state, COUNT(*) AS n FROM attempts a JOIN steps s ON s.id = a.step_id
WHERE s.task_id = :task_id GROUP BY a.state;

-- name: rejection_count_of_task
-- How many rejections a task's attempts got.
SELECT COUNT(*) AS n FROM rejections WHERE task_id = :task_id;

-- name: step_names_of_task
-- The name of each of a task's steps.
SELECT id, name FROM steps WHERE task_id = :task_id;

-- name: step_outputs_in_state
-- A task's steps in a state (committed) with their outputs, in order.
SELECT id, output_json FROM steps WHERE task_id = :task_id AND state = :state ORDER BY position;

-- name: step_counts_by_state
-- Steps by their state, their task's state and whether they were never attempted: what views.shown_state needs.
SELECT t.state AS task_state, s.attempt = 0 AS unrun, s.state, COUNT(*) AS n
FROM steps s JOIN tasks t ON t.id = s.task_id GROUP BY t.state, s.attempt = 0, s.state;

-- name: pool_queues
-- Per pool of live tasks (the last two states given): steps queued (the first state given) and in flight (the second), and when the oldest queued step was queued: after its last attempt ended, else when the step before it committed, else when its task was approved (the ledger stamps no queue time of its own).
SELECT (CASE WHEN s.verifies IS NULL THEN t.pool ELSE t.verify_pool END) AS pool,
    SUM(CASE WHEN s.state = :queued THEN 1 ELSE 0 END) AS queued,
    SUM(CASE WHEN s.state = :leased THEN 1 ELSE 0 END) AS in_flight,
    MIN(CASE WHEN s.state = :queued THEN COALESCE(
        (SELECT MAX(a.ended_at) FROM attempts a WHERE a.step_id = s.id),
        (SELECT p.committed_at FROM steps p WHERE p.task_id = s.task_id AND p.position = s.position - 1),
        t.approved_at, t.created_at) END) AS oldest
FROM steps s JOIN tasks t ON t.id = s.task_id
WHERE s.state IN (:queued, :leased) AND t.state IN (:task_queued, :task_running)
GROUP BY (CASE WHEN s.verifies IS NULL THEN t.pool ELSE t.verify_pool END);

-- name: runners_with_leases
-- Every runner with its token's name and how many leases (the state given) it holds in its pool, by pool, most recently seen first.
SELECT r.pool, r.runner_id, r.kinds_json, r.first_seen, r.last_seen, k.name AS token_name,
    (SELECT COUNT(*) FROM attempts a JOIN steps s ON s.id = a.step_id
        JOIN tasks t ON t.id = s.task_id
        WHERE a.runner_id = r.runner_id AND a.state = :leased
            AND (CASE WHEN s.verifies IS NULL THEN t.pool ELSE t.verify_pool END) = r.pool)
        AS in_flight
FROM runners r LEFT JOIN tokens k ON k.id = r.token_id
ORDER BY r.pool, r.last_seen DESC, r.runner_id;

-- name: runners_seen_since
-- The runners that claimed at or after a time, by pool, most recent first.
SELECT pool, runner_id, kinds_json, last_seen FROM runners WHERE last_seen >= :since
ORDER BY pool, last_seen DESC, runner_id;
