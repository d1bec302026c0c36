-- Verification and the review verdict (supervisor/ledger/verification.py): what evidence the
-- ledger holds for a task.

-- name: task_by_id
-- One task's row.
SELECT * FROM tasks WHERE id = :task_id;

-- name: repository_head_sha
-- The head SHA last known for a tenant's repository.
SELECT head_sha FROM repositories WHERE tenant = :tenant AND name = :repository;

-- name: task_candidate_sha
-- The candidate SHA a task's result stands for: the last one any of its steps reported.
SELECT candidate_sha FROM steps
WHERE task_id = :task_id AND candidate_sha IS NOT NULL
ORDER BY position DESC
LIMIT 1;

-- name: task_to_verify
-- One task's row, and as uneven_step a step of it that is not committed with exactly one effect, if any: the task cannot succeed.
SELECT t.*, (
    SELECT s.id FROM steps s
    WHERE s.task_id = t.id
      AND (s.state != {StepState.COMMITTED}
           OR (SELECT COUNT(*) FROM effects e WHERE e.step_id = s.id) != 1)
    LIMIT 1
) AS uneven_step
FROM tasks t WHERE t.id = :task_id;

-- name: committed_step_evidence
-- A task's committed steps with the candidate and the evidence each reported, in order.
SELECT id, position, candidate_sha, evidence_json FROM steps
WHERE task_id = :task_id AND state = {StepState.COMMITTED}
ORDER BY position;

-- name: check_runs_at_candidate
-- A task's check runs at one candidate by the steps of its plan (not a verifier's), with their steps' positions, in step order.
SELECT c.*, s.position FROM check_runs c JOIN steps s ON s.id = c.step_id
WHERE s.task_id = :task_id AND c.candidate_sha = :sha AND s.verifies IS NULL
ORDER BY s.position;

-- name: live_leases_of_task
-- How many attempts of a task's steps still hold a lease.
SELECT COUNT(*) AS n FROM attempts a JOIN steps s ON s.id = a.step_id
WHERE s.task_id = :task_id AND a.state = {AttemptState.LEASED};

-- name: task_candidate
-- The candidate a task's result stands for, the digest of its bundle and the payload of the step that made it: the last ones a step of its plan reported.
SELECT candidate_sha, bundle, payload_json FROM steps
WHERE task_id = :task_id AND candidate_sha IS NOT NULL AND verifies IS NULL
ORDER BY position DESC
LIMIT 1;

-- name: verify_step_at
-- A task's latest verify step of a candidate, whatever its state.
SELECT * FROM steps WHERE task_id = :task_id AND verifies = :sha ORDER BY position DESC LIMIT 1;

-- name: check_runs_of_step
-- The check runs a step's committed report named, by check name.
SELECT * FROM check_runs WHERE step_id = :step_id ORDER BY name;

-- name: committing_token
-- The runner token (id and name) of the attempt that committed a step.
SELECT a.token_id, k.name FROM attempts a LEFT JOIN tokens k ON k.id = a.token_id
WHERE a.step_id = :step_id AND a.state = {AttemptState.COMMITTED};
