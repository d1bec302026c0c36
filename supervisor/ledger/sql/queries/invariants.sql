-- The ledger's invariants (invariants.py): each query finds counter-examples; no row is a pass.
-- A query is named as its invariant, with _ for -. Outbox states are bound as parameters.

-- name: one_effect_per_step
-- Steps with more than one effect.
SELECT step_id, COUNT(*) AS n FROM effects GROUP BY step_id HAVING COUNT(*) > 1;

-- name: committed_has_effect
-- Committed steps without an effect.
SELECT s.id FROM steps s WHERE s.state = {StepState.COMMITTED}
AND NOT EXISTS (SELECT 1 FROM effects e WHERE e.step_id = s.id);

-- name: effect_has_commit
-- Effects whose step is not committed.
SELECT e.step_id FROM effects e JOIN steps s ON s.id = e.step_id
WHERE s.state != {StepState.COMMITTED};

-- name: effect_matches_intent
-- Effects whose payload hash is not their step's.
SELECT e.step_id FROM effects e JOIN steps s ON s.id = e.step_id
WHERE e.payload_hash != s.payload_hash;

-- name: no_stale_commit
-- A runner's effects not committed under the latest fence granted before them, or with no committed attempt under their fence.
SELECT x.step_id, x.fence, x.latest FROM (
    SELECT e.step_id, e.fence, (SELECT MAX(a.fence) FROM attempts a
        WHERE a.step_id = e.step_id AND a.granted_at <= e.created_at) AS latest
    FROM effects e WHERE e.step_id NOT IN (SELECT step_id FROM outbox)
) x
WHERE x.fence != x.latest OR x.latest IS NULL
    OR NOT EXISTS (SELECT 1 FROM attempts a WHERE a.step_id = x.step_id
        AND a.fence = x.fence AND a.state = {AttemptState.COMMITTED});

-- name: idempotency_key_unique
-- A tenant's idempotency keys naming more than one task.
SELECT tenant, idempotency_key, COUNT(*) AS n FROM tasks
GROUP BY tenant, idempotency_key HAVING COUNT(*) > 1;

-- name: one_live_lease_per_step
-- Steps with more than one leased attempt.
SELECT step_id, COUNT(*) AS n FROM attempts WHERE state = {AttemptState.LEASED}
GROUP BY step_id HAVING COUNT(*) > 1;

-- name: live_lease_is_the_steps
-- Leased attempts whose step is not leased under their fence.
SELECT a.step_id, a.fence, s.state FROM attempts a JOIN steps s ON s.id = a.step_id
WHERE a.state = {AttemptState.LEASED}
    AND (s.state != {StepState.LEASED} OR s.fence IS NULL OR s.fence != a.fence);

-- name: leased_step_has_its_lease
-- Leased steps with no leased attempt under their fence.
SELECT s.id, s.fence FROM steps s WHERE s.state = {StepState.LEASED} AND NOT EXISTS
    (SELECT 1 FROM attempts a WHERE a.step_id = s.id AND a.fence = s.fence
        AND a.state = {AttemptState.LEASED});

-- name: fences_increase
-- Attempts whose next attempt did not get a higher fence.
SELECT a.step_id, a.attempt, a.fence FROM attempts a JOIN attempts b
ON b.step_id = a.step_id AND b.attempt = a.attempt + 1 WHERE b.fence <= a.fence;

-- name: success_is_complete
-- Succeeded tasks with a step not committed.
SELECT t.id FROM tasks t WHERE t.state = {TaskState.SUCCEEDED} AND EXISTS
    (SELECT 1 FROM steps s WHERE s.task_id = t.id AND s.state != {StepState.COMMITTED});

-- name: success_verified_by_another
-- Succeeded tasks with a verifier pool whose final candidate (the latest plan step's with one) has no committed verify step committed under a runner token that holds no attempt of the task's other steps.
SELECT t.id FROM tasks t
WHERE t.state = {TaskState.SUCCEEDED} AND t.verify_pool IS NOT NULL AND t.repository IS NOT NULL
    AND NOT EXISTS (
        SELECT 1 FROM steps v JOIN attempts va ON va.step_id = v.id
        WHERE v.task_id = t.id AND v.state = {StepState.COMMITTED}
            AND va.state = {AttemptState.COMMITTED} AND va.token_id IS NOT NULL
            AND v.verifies = (SELECT s.candidate_sha FROM steps s WHERE s.task_id = t.id
                AND s.candidate_sha IS NOT NULL AND s.verifies IS NULL
                ORDER BY s.position DESC LIMIT 1)
            AND NOT EXISTS (SELECT 1 FROM attempts ma JOIN steps m ON m.id = ma.step_id
                WHERE m.task_id = t.id AND m.verifies IS NULL
                    AND (ma.token_id = va.token_id OR ma.token_id IS NULL)));

-- name: checkpoint_of_an_attempt
-- Checkpoints naming a fence no attempt of their step was granted.
SELECT k.step_id, k.fence FROM checkpoints k WHERE NOT EXISTS
    (SELECT 1 FROM attempts a WHERE a.step_id = k.step_id AND a.fence = k.fence);

-- name: terminal_is_final
-- Tasks whose journal moves them on from a terminal state.
SELECT t.task_id, t.state AS first, l.state AS later FROM events t JOIN events l
ON l.task_id = t.task_id AND l.seq > t.seq AND l.kind = 'state'
WHERE t.kind = 'state'
    AND t.state IN ({TaskState.SUCCEEDED}, {TaskState.FAILED}, {TaskState.CANCELLED});

-- name: task_state_is_last_event
-- Tasks whose state is not the last state their journal gives them.
SELECT x.id, x.state, x.last FROM (
    SELECT t.id, t.state, (SELECT e.state FROM events e WHERE e.task_id = t.id
        AND e.kind = 'state' ORDER BY e.seq DESC LIMIT 1) AS last
    FROM tasks t
) x
WHERE x.last IS NULL OR x.state != x.last;

-- name: delivered_effect_has_one_effect
-- Effects not recorded with exactly one effect row if delivered (the state given), or none otherwise.
SELECT x.step_id, x.n FROM (
    SELECT o.step_id, o.state, (SELECT COUNT(*) FROM effects e WHERE e.step_id = o.step_id) AS n
    FROM outbox o
) x
WHERE (x.state = :delivered AND x.n != 1) OR (x.state != :delivered AND x.n != 0);

-- name: unkeyed_sent_once_per_opening
-- Unkeyed effects with more than one attempt that may have sent under one gate opening (or under none).
SELECT d.step_id, d.opening, COUNT(*) AS n FROM deliveries d JOIN outbox o
ON o.step_id = d.step_id WHERE o.keyed = 0 AND (d.sent IS NULL OR d.sent = 1)
GROUP BY d.step_id, d.opening HAVING COUNT(*) > 1 OR d.opening < 1;

-- name: no_idle_sending_of_ended_task
-- Effects of ended tasks held for sending (the state given) with no delivery begun.
SELECT o.step_id FROM outbox o JOIN tasks t ON t.id = o.task_id
WHERE o.state = :sending
    AND t.state IN ({TaskState.SUCCEEDED}, {TaskState.FAILED}, {TaskState.CANCELLED})
    AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.step_id = o.step_id);

-- name: withdrawn_effect_sent_nothing
-- Withdrawn effects (the state given) with an attempt no operator settled that may have reached the receiver.
SELECT o.step_id, d.attempt FROM outbox o JOIN deliveries d ON d.step_id = o.step_id
WHERE o.state = :withdrawn AND d.attempt > o.settled_attempts AND (d.sent IS NULL OR d.sent = 1);

-- name: effect_step_never_leased
-- Effect steps (the supervisor delivers them) that were leased to a runner.
SELECT DISTINCT a.step_id FROM attempts a JOIN outbox o ON o.step_id = a.step_id;

-- name: task_has_steps
-- Tasks without steps: their plan's intents are missing.
SELECT t.id FROM tasks t WHERE NOT EXISTS (SELECT 1 FROM steps s WHERE s.task_id = t.id);

-- name: effect_keys
-- Every effect's key with what it is derived from (checked in Python: effect-key-is-identity).
SELECT effect_key, step_id, payload_hash FROM effects;
