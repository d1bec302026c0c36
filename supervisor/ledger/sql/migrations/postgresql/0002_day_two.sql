-- Day two (sqlite/0002_day_two.sql): tokens that can be told apart, the token behind each
-- attempt, and the runners seen by each pool (what they serve and when they last claimed).

-- A name an operator gives a token (`token create --name box-17`); NULL for older tokens.
ALTER TABLE tokens ADD COLUMN name text;
-- When the token last authenticated, written at most about once a minute (not per request).
ALTER TABLE tokens ADD COLUMN last_used_at double precision;

-- The runner token that claimed the attempt; NULL for attempts granted before this version.
ALTER TABLE attempts ADD COLUMN token_id text;

-- One row per runner that has claimed in a pool: what it announced it serves, and when it was
-- last seen. Written by the claim rule; read by task views ("waiting for a runner") and status.
CREATE TABLE runners (
    pool       text NOT NULL,
    runner_id  text NOT NULL,
    token_id   text,
    kinds_json text NOT NULL DEFAULT '["chat"]',
    first_seen double precision NOT NULL,
    last_seen  double precision NOT NULL,
    PRIMARY KEY (pool, runner_id)
);
