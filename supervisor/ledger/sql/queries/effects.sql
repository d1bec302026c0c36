-- name: insert_effect
-- Record a step's one effect under its effect key.
INSERT INTO effects (effect_key, step_id, task_id, fence, payload_hash, output_json, usage_json,
    candidate_sha, created_at)
VALUES (:effect_key, :step_id, :task_id, :fence, :payload_hash, :output_json, :usage_json, :candidate_sha, :now);

-- name: commit_step
-- Mark a step committed with its output, candidate, bundle and evidence; its lease is over.
UPDATE steps SET state = :state, output_json = :output_json, candidate_sha = :candidate_sha, bundle = :bundle, evidence_json = :evidence_json,
    committed_at = :now, lease_deadline = NULL, accept_deadline = NULL
WHERE id = :step_id;

-- name: record_step_artifact
-- Record an artifact a step's result named for its candidate; a repeat takes the new digest.
INSERT INTO artifacts (task_id, step_id, candidate_sha, name, digest) VALUES (:task_id, :step_id, :candidate_sha, :name, :digest)
ON CONFLICT (task_id, candidate_sha, name, step_id) DO UPDATE SET digest = excluded.digest;

-- name: record_check_run
-- Record a check a step's result ran on its candidate.
INSERT INTO check_runs (step_id, name, candidate_sha, log_digest, exit_code, duration_s)
VALUES (:step_id, :name, :candidate_sha, :log_digest, :exit_code, :duration_s);

-- name: committing_attempt
-- The attempt that committed a step.
SELECT attempt, fence, runner_id, token_id FROM attempts
WHERE step_id = :step_id AND state = {AttemptState.COMMITTED};

-- name: first_uncommitted_step
-- A task's first step not yet committed, by position, with its kind.
SELECT id, state, kind FROM steps WHERE task_id = :task_id AND state != :committed ORDER BY position LIMIT 1;
