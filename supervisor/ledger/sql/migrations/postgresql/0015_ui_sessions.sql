-- Issue 23: the status page's sessions (sqlite/0015_ui_sessions.sql says what each holds).
CREATE TABLE ui_sessions (
    id_hash    text PRIMARY KEY,
    token_id   text NOT NULL REFERENCES tokens (id),
    created_at double precision NOT NULL,
    expires_at double precision NOT NULL,
    ended_at   double precision
);
CREATE INDEX ui_sessions_by_expiry ON ui_sessions (expires_at);
