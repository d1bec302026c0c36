-- name: commit_result
-- Record a step's one effect under its effect key, mark the step committed (its lease over) and end its attempt under the fence if still leased, in one statement (SQLite: insert_effect, commit_step, end_live_attempt).
WITH effect AS (
    INSERT INTO effects (effect_key, step_id, task_id, fence, payload_hash, output_json,
        usage_json, candidate_sha, created_at)
    VALUES (:effect_key, :step_id, :task_id, :fence, :payload_hash, :output_json, :usage_json,
        :effect_candidate_sha, :now)
),
committed AS (
    UPDATE steps SET state = {StepState.COMMITTED}, output_json = :output_json,
        candidate_sha = :step_candidate_sha, bundle = :bundle, evidence_json = :evidence_json,
        committed_at = :now, lease_deadline = NULL, accept_deadline = NULL
    WHERE id = :step_id
)
UPDATE attempts SET state = {AttemptState.COMMITTED}, reason = 'committed', ended_at = :now
WHERE step_id = :step_id AND fence = :fence AND state = {AttemptState.LEASED};
