-- name: attempts_of_fences
-- The attempts a batch of log lines names (fences as a JSON list): step, token, task, the step's pool (a verify step's is its task's verifier pool), the task's last seq and the lines each holds.
SELECT a.fence, a.step_id, a.token_id, s.task_id,
       (CASE WHEN s.verifies IS NULL THEN t.pool ELSE t.verify_pool END) AS pool, t.last_seq,
       (SELECT COUNT(*) FROM log_lines l WHERE l.fence = a.fence) AS kept
FROM attempts a JOIN steps s ON s.id = a.step_id JOIN tasks t ON t.id = s.task_id
WHERE a.fence IN (SELECT value FROM json_each(:fences));
