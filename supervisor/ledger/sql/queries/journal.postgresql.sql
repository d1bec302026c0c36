-- name: append_events
-- Append a rule's events in the order given (a JSON list of [task_id, kind, state, data_json]) and set each task's last_seq to its latest: one statement.
WITH added AS (
    INSERT INTO events (task_id, kind, state, data_json, at)
    SELECT e.event ->> 0, e.event ->> 1, e.event ->> 2, e.event ->> 3, :now
    FROM jsonb_array_elements(:events::jsonb) WITH ORDINALITY AS e (event, n)
    ORDER BY e.n
    RETURNING seq, task_id
)
UPDATE tasks SET last_seq = (SELECT MAX(seq) FROM added WHERE added.task_id = tasks.id)
WHERE id = ANY (ARRAY(SELECT task_id FROM added));
