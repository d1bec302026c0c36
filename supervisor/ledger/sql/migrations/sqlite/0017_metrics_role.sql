-- A third token role, `metrics`: the only one `GET /metrics` answers (tenant names and their
-- spend are not public). SQLite cannot change a CHECK in place: the table is made again with
-- the same columns and rows.
CREATE TABLE tokens_with_metrics (
    id           TEXT PRIMARY KEY,
    scope        TEXT NOT NULL,           -- tenant for operators, pool for runners, a label for metrics
    role         TEXT NOT NULL CHECK (role IN ('operator', 'runner', 'metrics')),
    secret_hash  TEXT NOT NULL UNIQUE,
    created_at   REAL NOT NULL,
    revoked_at   REAL,
    name         TEXT,
    last_used_at REAL
) STRICT;
INSERT INTO tokens_with_metrics (id, scope, role, secret_hash, created_at, revoked_at, name, last_used_at)
SELECT id, scope, role, secret_hash, created_at, revoked_at, name, last_used_at FROM tokens;
DROP TABLE tokens;
ALTER TABLE tokens_with_metrics RENAME TO tokens;
