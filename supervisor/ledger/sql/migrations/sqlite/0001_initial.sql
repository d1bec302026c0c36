-- The ledger's first schema. Every later change is a new numbered file; the number applied is
-- kept in PRAGMA user_version.

CREATE TABLE counters (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) STRICT;
-- One strictly increasing fencing counter for every lease grant, across restarts.
INSERT INTO counters (name, value) VALUES ('fence', 0);

CREATE TABLE tasks (
    id                   TEXT PRIMARY KEY,
    tenant               TEXT NOT NULL,
    idempotency_key      TEXT NOT NULL,
    pool                 TEXT NOT NULL DEFAULT 'default',
    state                TEXT NOT NULL,
    plan_hash            TEXT NOT NULL,
    plan_json            TEXT NOT NULL,
    repository           TEXT,
    declared_base_sha    TEXT,
    approved_base_sha    TEXT,
    requirement_revision TEXT,
    allowed_paths_json   TEXT NOT NULL DEFAULT '[]',
    expected_checks_json TEXT NOT NULL DEFAULT '[]',
    owner                TEXT,
    reason               TEXT,
    reviewer_decision    TEXT,
    created_order        INTEGER NOT NULL,
    created_at           REAL NOT NULL,
    approved_at          REAL,
    started_at           REAL,
    finished_at          REAL,
    last_seq             INTEGER NOT NULL DEFAULT 0
) STRICT;
-- Kept as its own index so the schedule explorer's `key-reuse` plant can drop it.
CREATE UNIQUE INDEX tasks_idempotency ON tasks (tenant, idempotency_key);
CREATE UNIQUE INDEX tasks_by_order ON tasks (created_order);
CREATE INDEX tasks_by_tenant ON tasks (tenant, created_order);
CREATE INDEX tasks_by_state ON tasks (state, created_order);

CREATE TABLE steps (
    id              TEXT PRIMARY KEY,
    task_id         TEXT NOT NULL REFERENCES tasks (id),
    position        INTEGER NOT NULL,
    task_order      INTEGER NOT NULL,           -- the task's created_order: queue order
    name            TEXT NOT NULL,
    kind            TEXT NOT NULL,
    payload_json    TEXT NOT NULL,
    payload_hash    TEXT NOT NULL,              -- the durable intent
    state           TEXT NOT NULL,
    attempt         INTEGER NOT NULL DEFAULT 0, -- grants so far; the next lease is attempt + 1
    burned          INTEGER NOT NULL DEFAULT 0, -- attempts counted toward max_attempts
    fence           INTEGER,                    -- the current lease's token, NULL when none
    runner_id       TEXT,
    lease_deadline  REAL,                       -- supervisor clock only
    accept_deadline REAL,                       -- NULL once the runner acknowledged the lease
    output_json     TEXT,
    candidate_sha   TEXT,
    committed_at    REAL,
    UNIQUE (task_id, position)
) STRICT;
CREATE INDEX steps_queued ON steps (task_order, position) WHERE state = 'queued';
CREATE INDEX steps_leased ON steps (state, lease_deadline) WHERE state = 'leased';

CREATE TABLE attempts (
    step_id    TEXT NOT NULL REFERENCES steps (id),
    attempt    INTEGER NOT NULL,
    fence      INTEGER NOT NULL UNIQUE,
    runner_id  TEXT NOT NULL,
    state      TEXT NOT NULL,
    reason     TEXT,
    granted_at REAL NOT NULL,
    ended_at   REAL,
    PRIMARY KEY (step_id, attempt)
) STRICT;

-- At most one row per effect key; the key is derived from the step's identity, so one per step.
CREATE TABLE effects (
    effect_key    TEXT PRIMARY KEY,
    step_id       TEXT NOT NULL REFERENCES steps (id),
    task_id       TEXT NOT NULL REFERENCES tasks (id),
    fence         INTEGER NOT NULL,
    payload_hash  TEXT NOT NULL,
    output_json   TEXT NOT NULL,
    usage_json    TEXT NOT NULL,
    candidate_sha TEXT,
    created_at    REAL NOT NULL
) STRICT;
CREATE INDEX effects_by_step ON effects (step_id);

CREATE TABLE artifacts (
    task_id       TEXT NOT NULL REFERENCES tasks (id),
    step_id       TEXT NOT NULL REFERENCES steps (id),
    candidate_sha TEXT NOT NULL,
    name          TEXT NOT NULL,
    digest        TEXT NOT NULL,
    PRIMARY KEY (task_id, candidate_sha, name, step_id)
) STRICT;

CREATE TABLE events (
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id   TEXT NOT NULL REFERENCES tasks (id),
    kind      TEXT NOT NULL,
    state     TEXT NOT NULL,
    data_json TEXT NOT NULL,
    at        REAL NOT NULL
) STRICT;
CREATE INDEX events_by_task ON events (task_id, seq);

-- Refused writes: stale fences, drifted payloads, late transitions. Observable, never a state.
CREATE TABLE rejections (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT,
    step_id TEXT,
    fence   INTEGER,
    code    TEXT NOT NULL,
    detail  TEXT NOT NULL,
    at      REAL NOT NULL
) STRICT;

CREATE TABLE repositories (
    tenant     TEXT NOT NULL,
    name       TEXT NOT NULL,
    head_sha   TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (tenant, name)
) STRICT;

CREATE TABLE tenants (
    name         TEXT PRIMARY KEY,
    token_budget INTEGER,                 -- NULL: unlimited
    tokens_used  INTEGER NOT NULL DEFAULT 0
) STRICT;

CREATE TABLE tokens (
    id          TEXT PRIMARY KEY,
    scope       TEXT NOT NULL,            -- tenant for operators, pool for runners
    role        TEXT NOT NULL CHECK (role IN ('operator', 'runner')),
    secret_hash TEXT NOT NULL UNIQUE,
    created_at  REAL NOT NULL,
    revoked_at  REAL
) STRICT;
