-- The outbox of effect steps (supervisor/ledger/outbox.py): due rows, holds, delivery attempts
-- and operators' words. Outbox states are bound as parameters (`OutboxState`).

-- name: queue_ready_step
-- Queue a step that is not an effect for the runners of its pool (`outbox.start`).
UPDATE steps SET state = {StepState.QUEUED} WHERE id = :step_id;

-- name: insert_due_effect
-- Write an effect step's outbox row with its rendered request, as it becomes due.
INSERT INTO outbox (step_id, task_id, kind, effect_key, keyed, request_json, digest, state,
                    deadline_s, deadline_at, not_before, created_at)
VALUES (:step_id, :task_id, :kind, :effect_key, :keyed, :request_json, :digest, :state, :deadline_s, :deadline_at, :now, :now);

-- name: mark_effect_step_due
-- The effect step's own state once its outbox row is written.
UPDATE steps SET state = {StepState.DUE} WHERE id = :step_id;

-- name: committed_outputs_before
-- The outputs of a task's committed steps before a position: what an effect's placeholders fill from.
SELECT name, output_json FROM steps
WHERE task_id = :task_id AND position < :position AND state = {StepState.COMMITTED}
ORDER BY position;

-- name: effect_row
-- One outbox row by its step, with its task's state and tenant.
SELECT o.*, t.state AS task_state, t.tenant
FROM outbox o JOIN tasks t ON t.id = o.task_id
WHERE o.step_id = :step_id;

-- name: lapsed_effects
-- Rows in a state (`sending`) whose dispatcher's hold lapsed before a time, oldest first.
SELECT o.*, t.state AS task_state, t.tenant
FROM outbox o JOIN tasks t ON t.id = o.task_id
WHERE o.state = :sending AND o.held_until < :now
ORDER BY o.created_at;

-- name: unheld_effects_of_task
-- A task's rows no dispatcher is delivering: in one of three states (`UNHELD`), or in a fourth (`sending`) with no attempt begun.
SELECT o.*, t.state AS task_state, t.tenant
FROM outbox o JOIN tasks t ON t.id = o.task_id
WHERE o.task_id = :task_id
  AND (o.state IN (:due, :gated, :open)
       OR (o.state = :sending AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.step_id = o.step_id)))
ORDER BY o.created_at;

-- name: move_effect
-- Move a row to a state short of its end; it drops its holder.
UPDATE outbox SET state = :state, holder = NULL, held_until = NULL WHERE step_id = :step_id;

-- name: end_effect
-- Move a row to an end state (delivered, failed, withdrawn) at a time; it drops its holder.
UPDATE outbox SET state = :state, holder = NULL, held_until = NULL, ended_at = :now WHERE step_id = :step_id;

-- name: hold_effect
-- Hand a row to a dispatcher (state `sending`) until a time.
UPDATE outbox SET state = :state, holder = :holder, held_until = :held_until WHERE step_id = :step_id;

-- name: open_effect_gate
-- Open an unkeyed row's gate (state `open`) for a digest: one more opening, its deadline and earliest send.
UPDATE outbox
SET state = :state, holder = NULL, held_until = NULL, openings = :openings, gate_digest = :gate_digest, deadline_at = :deadline_at,
    not_before = :now
WHERE step_id = :step_id;

-- name: regate_effect
-- Put an unkeyed row back behind its gate (state `gated`) after an operator's `no`, once.
UPDATE outbox
SET state = :state, holder = NULL, held_until = NULL, said_no = 1, gate_digest = NULL
WHERE step_id = :step_id;

-- name: extend_effect_hold
-- Extend the holding dispatcher's hold on a row until a time.
UPDATE outbox SET held_until = :held_until WHERE step_id = :step_id;

-- name: unsettled_deliveries
-- An effect's attempts after those an operator's word settled, in order.
SELECT * FROM deliveries WHERE step_id = :step_id AND attempt > :settled_attempts ORDER BY attempt;

-- name: unsettled_deliveries_of_opening
-- An effect's attempts after those an operator's word settled, under one gate opening, in order.
SELECT * FROM deliveries WHERE step_id = :step_id AND attempt > :settled_attempts AND opening = :opening ORDER BY attempt;

-- name: cancel_effect_step
-- Cancel a withdrawn effect's step.
UPDATE steps SET state = {StepState.CANCELLED} WHERE id = :step_id;

-- name: last_delivery_attempt
-- The number of an effect's latest delivery attempt (NULL: none yet).
SELECT MAX(attempt) AS n FROM deliveries WHERE step_id = :step_id;

-- name: insert_delivery
-- Record a delivery attempt before anything of it is sent.
INSERT INTO deliveries (step_id, attempt, opening, holder, started_at) VALUES (:step_id, :attempt, :opening, :holder, :now);

-- name: record_pushed_sha
-- The candidate a task's push is about to send: a head read that reports it is the task's own push.
UPDATE tasks SET pushed_sha = :pushed_sha WHERE id = :task_id;

-- name: delivery_attempt
-- One delivery attempt of an effect.
SELECT * FROM deliveries WHERE step_id = :step_id AND attempt = :attempt;

-- name: unsettled_delivery_attempt
-- Holder and answer of one attempt, if no operator's word settled it (attempt above a count).
SELECT holder, answer FROM deliveries WHERE step_id = :step_id AND attempt = :attempt AND attempt > :settled_attempts;

-- name: answer_delivery
-- Record the receiver's answer to a delivery attempt.
UPDATE deliveries
SET ended_at = :now, answer = :answer, sent = :sent, status = :status, detail = :detail, error = :error
WHERE step_id = :step_id AND attempt = :attempt;

-- name: insert_delivered_effect
-- The one effect row of a delivered effect step (its usage and candidate are given).
INSERT INTO effects (effect_key, step_id, task_id, fence, payload_hash, output_json, usage_json,
                     candidate_sha, created_at)
VALUES (:effect_key, :step_id, :task_id, :fence, :payload_hash, :output_json, :usage_json, NULL, :now);

-- name: commit_delivered_step
-- Commit a delivered effect's step with the delivery's observation as its output.
UPDATE steps SET state = {StepState.COMMITTED}, output_json = :output_json, committed_at = :now WHERE id = :step_id;

-- name: fail_effect_step
-- Fail an effect step whose task has already ended (the task keeps its state).
UPDATE steps SET state = {StepState.FAILED} WHERE id = :step_id;

-- name: release_unanswered_deliveries
-- End an effect's attempts still waiting for an answer when its dispatcher releases it.
UPDATE deliveries SET ended_at = :now, detail = 'released without an answer'
WHERE step_id = :step_id AND answer IS NULL AND ended_at IS NULL;

-- name: tenant_task_id
-- A task's id, if it is the tenant's.
SELECT id FROM tasks WHERE id = :task_id AND tenant = :tenant;

-- name: first_step_named
-- The first step of a task with a name (an operator names an effect by its step's name).
SELECT id, kind FROM steps WHERE task_id = :task_id AND name = :step_name ORDER BY position LIMIT 1;

-- name: settle_effect_attempts
-- An operator's word settles every attempt made so far.
UPDATE outbox
SET settled_attempts = (SELECT COALESCE(MAX(attempt), 0) FROM deliveries WHERE step_id = :step_id)
WHERE step_id = :step_id;

-- name: mark_effect_said_no
-- Count an operator's `no` on an effect (at most one).
UPDATE outbox SET said_no = 1 WHERE step_id = :step_id;

-- name: insert_effect_decision
-- Record what an operator did to an effect, with the token's name and the time.
INSERT INTO effect_decisions (step_id, action, digest, by, at) VALUES (:step_id, :action, :digest, :by, :now);
