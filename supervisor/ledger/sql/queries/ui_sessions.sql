-- name: start_ui_session
-- A new status-page session of a token: only its id's sha256 is stored.
INSERT INTO ui_sessions (id_hash, token_id, created_at, expires_at) VALUES (:id_hash, :token_id, :now, :expires_at);

-- name: live_ui_session
-- The operator behind a session that has not ended, not expired and whose token is live.
SELECT t.id, t.scope, t.role, t.last_used_at FROM ui_sessions s JOIN tokens t ON t.id = s.token_id
WHERE s.id_hash = :id_hash AND s.ended_at IS NULL AND s.expires_at > :now AND t.revoked_at IS NULL
  AND t.role = 'operator';

-- name: end_ui_session
-- Sign-out: the session ends now; ending it again keeps the first time.
UPDATE ui_sessions SET ended_at = COALESCE(ended_at, :now) WHERE id_hash = :id_hash;

-- name: forget_old_ui_sessions
-- Remove sessions that expired or ended before a time (kept a while for `check` and audits).
DELETE FROM ui_sessions WHERE expires_at < :before OR ended_at < :before;
