-- Issue 13's effect steps (sqlite/0007_effects.sql): the outbox of rendered requests, one row
-- per delivery attempt, and what operators did to effects.

CREATE TABLE outbox (
    step_id     text PRIMARY KEY REFERENCES steps (id),
    task_id     text NOT NULL REFERENCES tasks (id),
    kind        text NOT NULL,
    effect_key  text NOT NULL,
    keyed       bigint NOT NULL,            -- 1: sent with its key, retried; 0: behind a gate
    request_json text NOT NULL,             -- rendered at due time; credentials by name only
    digest      text NOT NULL,              -- content_hash of the request
    state       text NOT NULL,              -- supervisor.ledger.outbox.OutboxState
    deadline_s  double precision NOT NULL,
    deadline_at double precision,           -- keyed: due time + deadline_s; unkeyed: per opening
    not_before  double precision NOT NULL,
    holder      text,                       -- the dispatcher holding a `sending` row
    held_until  double precision,
    openings    bigint NOT NULL DEFAULT 0,  -- gate openings so far
    gate_digest text,                       -- the digest the current opening was given for
    said_no     bigint NOT NULL DEFAULT 0,  -- `happened no` answers so far (at most one)
    created_at  double precision NOT NULL,
    ended_at    double precision
);
CREATE INDEX outbox_ready ON outbox (state, not_before);
CREATE INDEX outbox_by_task ON outbox (task_id);

-- One row per delivery attempt. `sent` is NULL while the attempt is in flight (or if it was
-- never answered), 0 when the request certainly did not reach the receiver, 1 when it may have.
CREATE TABLE deliveries (
    step_id    text NOT NULL REFERENCES outbox (step_id),
    attempt    bigint NOT NULL,
    opening    bigint NOT NULL,             -- the gate opening it was sent under (0: keyed)
    holder     text NOT NULL,
    started_at double precision NOT NULL,
    ended_at   double precision,
    answer     text,                        -- delivered, refused, unanswered; NULL: none
    sent       bigint,
    status     bigint,
    detail     text,
    error      text,                        -- the refusal's code
    PRIMARY KEY (step_id, attempt)
);

-- What operators did to effects: opened a gate for a digest, or said whether an uncertain
-- effect happened. Kept with the operator token's name and the time, for the review record.
CREATE TABLE effect_decisions (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    step_id  text NOT NULL REFERENCES outbox (step_id),
    action   text NOT NULL CHECK (action IN ('open', 'happened', 'not_happened')),
    digest   text,
    by       text NOT NULL,
    at       double precision NOT NULL
);
CREATE INDEX effect_decisions_by_step ON effect_decisions (step_id, id);
