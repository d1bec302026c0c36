-- name: keep_log_line
-- Keep one line a runner shipped about an attempt.
INSERT INTO log_lines (task_id, step_id, fence, after_seq, level, event, fields_json, at)
VALUES (:task_id, :step_id, :fence, :after_seq, :level, :event, :fields_json, :at);

-- name: log_lines_after
-- A task's runner lines after a line id, in receipt order, with their attempt's number and runner, at most so many.
SELECT l.id, l.step_id, l.fence, l.after_seq, l.level, l.event, l.fields_json, l.at,
       a.attempt, a.runner_id
FROM log_lines l JOIN attempts a ON a.fence = l.fence
WHERE l.task_id = :task_id AND l.id > :after_line
ORDER BY l.id LIMIT :limit;
