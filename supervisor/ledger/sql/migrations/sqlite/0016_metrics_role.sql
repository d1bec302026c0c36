-- A third token role, `metrics`: the only one `GET /metrics` answers (tenant names and their
-- spend are not public). SQLite cannot change a CHECK in place: the table is made again with
-- the same columns and rows. Other tables reference `tokens (id)` (`ui_sessions`), so the
-- foreign keys are checked at commit, once the rows are back under the same ids.
PRAGMA defer_foreign_keys = ON;
CREATE TABLE tokens_before_metrics AS SELECT * FROM tokens;
DROP TABLE tokens;
CREATE TABLE tokens (
    id           TEXT PRIMARY KEY,
    scope        TEXT NOT NULL,           -- tenant for operators, pool for runners, a label for metrics
    role         TEXT NOT NULL CHECK (role IN ('operator', 'runner', 'metrics')),
    secret_hash  TEXT NOT NULL UNIQUE,
    created_at   REAL NOT NULL,
    revoked_at   REAL,
    name         TEXT,
    last_used_at REAL
) STRICT;
INSERT INTO tokens (id, scope, role, secret_hash, created_at, revoked_at, name, last_used_at)
SELECT id, scope, role, secret_hash, created_at, revoked_at, name, last_used_at
FROM tokens_before_metrics;
DROP TABLE tokens_before_metrics;
