-- Issue 13's effect steps (docs/design.md, Effects): a step of an effect kind is delivered by
-- the supervisor. When it becomes due, the transaction that makes it due writes its rendered
-- request here; every delivery attempt is a row of `deliveries`, written before it is sent.

CREATE TABLE outbox (
    step_id     TEXT PRIMARY KEY REFERENCES steps (id),
    task_id     TEXT NOT NULL REFERENCES tasks (id),
    kind        TEXT NOT NULL,
    effect_key  TEXT NOT NULL,
    keyed       INTEGER NOT NULL,           -- 1: sent with its key, retried; 0: behind a gate
    request_json TEXT NOT NULL,             -- rendered at due time; credentials by name only
    digest      TEXT NOT NULL,              -- content_hash of the request
    state       TEXT NOT NULL,              -- supervisor.ledger.outbox.OutboxState
    deadline_s  REAL NOT NULL,
    deadline_at REAL,                       -- keyed: due time + deadline_s; unkeyed: per opening
    not_before  REAL NOT NULL,
    holder      TEXT,                       -- the dispatcher holding a `sending` row
    held_until  REAL,
    openings    INTEGER NOT NULL DEFAULT 0, -- gate openings so far
    gate_digest TEXT,                       -- the digest the current opening was given for
    said_no     INTEGER NOT NULL DEFAULT 0, -- `happened no` answers so far (at most one)
    created_at  REAL NOT NULL,
    ended_at    REAL
) STRICT;
CREATE INDEX outbox_ready ON outbox (state, not_before);
CREATE INDEX outbox_by_task ON outbox (task_id);

-- One row per delivery attempt. `sent` is NULL while the attempt is in flight (or if it was
-- never answered), 0 when the request certainly did not reach the receiver, 1 when it may have.
CREATE TABLE deliveries (
    step_id    TEXT NOT NULL REFERENCES outbox (step_id),
    attempt    INTEGER NOT NULL,
    opening    INTEGER NOT NULL,            -- the gate opening it was sent under (0: keyed)
    holder     TEXT NOT NULL,
    started_at REAL NOT NULL,
    ended_at   REAL,
    answer     TEXT,                        -- delivered, refused, unanswered; NULL: none
    sent       INTEGER,
    status     INTEGER,
    detail     TEXT,
    error      TEXT,                        -- the refusal's code
    PRIMARY KEY (step_id, attempt)
) STRICT;

-- What operators did to effects: opened a gate for a digest, or said whether an uncertain
-- effect happened. Kept with the operator token's name and the time, for the review record.
CREATE TABLE effect_decisions (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    step_id  TEXT NOT NULL REFERENCES outbox (step_id),
    action   TEXT NOT NULL CHECK (action IN ('open', 'happened', 'not_happened')),
    digest   TEXT,
    by       TEXT NOT NULL,
    at       REAL NOT NULL
) STRICT;
CREATE INDEX effect_decisions_by_step ON effect_decisions (step_id, id);
