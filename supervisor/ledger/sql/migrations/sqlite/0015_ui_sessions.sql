-- Issue 23: the status page's sessions (docs/design.md, Status page and OpenAPI document). A
-- sign-in with an operator token starts one; its cookie holds the session's id, never the
-- token, and the ledger keeps only the id's sha256. A session ends at sign-out (`ended_at`),
-- at `expires_at` (the setting `ui_session_ttl_s` after sign-in), or when its token is
-- revoked (every lookup joins the token and wants it live).
CREATE TABLE ui_sessions (
    id_hash    TEXT PRIMARY KEY,
    token_id   TEXT NOT NULL REFERENCES tokens (id),
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    ended_at   REAL
) STRICT;
CREATE INDEX ui_sessions_by_expiry ON ui_sessions (expires_at);
