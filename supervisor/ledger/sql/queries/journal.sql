-- name: set_task_last_seq
-- Record on a task the sequence number of its latest event (`events_by_task` finds it): SQLite, after append_events.
UPDATE tasks SET last_seq = (SELECT MAX(seq) FROM events WHERE task_id = :task_id) WHERE id = :task_id;

-- name: task_of_step
-- The task a step belongs to.
SELECT task_id FROM steps WHERE id = :step_id;

-- name: record_rejection
-- Keep a refused write for operators and the review record.
INSERT INTO rejections (task_id, step_id, fence, code, detail, at) VALUES (:task_id, :step_id, :fence, :code, :detail, :now);
