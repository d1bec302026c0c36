-- Day two: tokens that can be told apart, the token behind each attempt, and the runners seen
-- by each pool (what they serve and when they last claimed).

-- A name an operator gives a token (`token create --name box-17`); NULL for older tokens.
ALTER TABLE tokens ADD COLUMN name TEXT;
-- When the token last authenticated, written at most about once a minute (not per request).
ALTER TABLE tokens ADD COLUMN last_used_at REAL;

-- The runner token that claimed the attempt; NULL for attempts granted before this version.
ALTER TABLE attempts ADD COLUMN token_id TEXT;

-- One row per runner that has claimed in a pool: what it announced it serves, and when it was
-- last seen. Written by the claim rule; read by task views ("waiting for a runner") and status.
CREATE TABLE runners (
    pool       TEXT NOT NULL,
    runner_id  TEXT NOT NULL,
    token_id   TEXT,
    kinds_json TEXT NOT NULL DEFAULT '["chat"]',
    first_seen REAL NOT NULL,
    last_seen  REAL NOT NULL,
    PRIMARY KEY (pool, runner_id)
) STRICT;
