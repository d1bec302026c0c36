-- name: append_event
-- Append one event to the journal; its sequence number is the ledger-wide order.
INSERT INTO events (task_id, kind, state, data_json, at) VALUES (?, ?, ?, ?, ?) RETURNING seq;
