-- name: append_events
-- Append a rule's events in the order given (a JSON list of [task_id, kind, state, data_json]); set_task_last_seq follows.
INSERT INTO events (task_id, kind, state, data_json, at)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
       json_extract(value, '$[3]'), :now
FROM json_each(:events) ORDER BY key;
