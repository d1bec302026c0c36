-- name: checkpoint_held
-- The fence and turn of a step's latest checkpoint.
SELECT fence, turn FROM checkpoints WHERE step_id = :step_id;

-- name: save_checkpoint
-- Keep a checkpoint as the step's latest, replacing the one it held.
INSERT INTO checkpoints (step_id, fence, turn, transcript, bundle, sha, step_usage_json, created_at)
VALUES (:step_id, :fence, :turn, :transcript, :bundle, :sha, :step_usage_json, :now)
ON CONFLICT (step_id) DO UPDATE SET fence = excluded.fence, turn = excluded.turn,
    transcript = excluded.transcript, bundle = excluded.bundle, sha = excluded.sha,
    step_usage_json = excluded.step_usage_json, created_at = excluded.created_at;
