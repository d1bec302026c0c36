-- The ledger's first schema, for PostgreSQL: sqlite/0001_initial.sql translated (INTEGER ->
-- bigint, REAL -> double precision, TEXT -> text, AUTOINCREMENT -> an identity). Every later
-- change is a new numbered file, the same number as SQLite's; the number applied is kept in the
-- table schema_version (supervisor/ledger/pg_schema.py).

-- Named counters. Unlike SQLite's, it holds no 'fence' row: fences come from the sequence below.
CREATE TABLE counters (
    name  text PRIMARY KEY,
    value bigint NOT NULL
);
-- One strictly increasing fencing counter for every lease grant, across restarts
-- (`SELECT nextval('fences')`); the first fence is 1, as SQLite's counter gives.
CREATE SEQUENCE fences AS bigint MINVALUE 1 START WITH 1 NO CYCLE;

CREATE TABLE tasks (
    id                   text PRIMARY KEY,
    tenant               text NOT NULL,
    idempotency_key      text NOT NULL,
    pool                 text NOT NULL DEFAULT 'default',
    state                text NOT NULL,
    plan_hash            text NOT NULL,
    plan_json            text NOT NULL,
    repository           text,
    declared_base_sha    text,
    approved_base_sha    text,
    requirement_revision text,
    allowed_paths_json   text NOT NULL DEFAULT '[]',
    expected_checks_json text NOT NULL DEFAULT '[]',
    owner                text,
    reason               text,
    reviewer_decision    text,
    created_order        bigint NOT NULL,
    created_at           double precision NOT NULL,
    approved_at          double precision,
    started_at           double precision,
    finished_at          double precision,
    last_seq             bigint NOT NULL DEFAULT 0
);
-- Kept as its own index so the schedule explorer's `key-reuse` plant can drop it.
CREATE UNIQUE INDEX tasks_idempotency ON tasks (tenant, idempotency_key);
CREATE UNIQUE INDEX tasks_by_order ON tasks (created_order);
CREATE INDEX tasks_by_tenant ON tasks (tenant, created_order);
CREATE INDEX tasks_by_state ON tasks (state, created_order);

CREATE TABLE steps (
    id              text PRIMARY KEY,
    task_id         text NOT NULL REFERENCES tasks (id),
    position        bigint NOT NULL,
    task_order      bigint NOT NULL,            -- the task's created_order: queue order
    name            text NOT NULL,
    kind            text NOT NULL,
    payload_json    text NOT NULL,
    payload_hash    text NOT NULL,              -- the durable intent
    state           text NOT NULL,
    attempt         bigint NOT NULL DEFAULT 0,  -- grants so far; the next lease is attempt + 1
    burned          bigint NOT NULL DEFAULT 0,  -- attempts counted toward max_attempts
    fence           bigint,                     -- the current lease's token, NULL when none
    runner_id       text,
    lease_deadline  double precision,           -- supervisor clock only
    accept_deadline double precision,           -- NULL once the runner acknowledged the lease
    output_json     text,
    candidate_sha   text,
    committed_at    double precision,
    UNIQUE (task_id, position)
);
CREATE INDEX steps_queued ON steps (task_order, position) WHERE state = 'queued';
CREATE INDEX steps_leased ON steps (state, lease_deadline) WHERE state = 'leased';

CREATE TABLE attempts (
    step_id    text NOT NULL REFERENCES steps (id),
    attempt    bigint NOT NULL,
    fence      bigint NOT NULL UNIQUE,
    runner_id  text NOT NULL,
    state      text NOT NULL,
    reason     text,
    granted_at double precision NOT NULL,
    ended_at   double precision,
    PRIMARY KEY (step_id, attempt)
);

-- At most one row per effect key; the key is derived from the step's identity, so one per step.
CREATE TABLE effects (
    effect_key    text PRIMARY KEY,
    step_id       text NOT NULL REFERENCES steps (id),
    task_id       text NOT NULL REFERENCES tasks (id),
    fence         bigint NOT NULL,
    payload_hash  text NOT NULL,
    output_json   text NOT NULL,
    usage_json    text NOT NULL,
    candidate_sha text,
    created_at    double precision NOT NULL
);
CREATE INDEX effects_by_step ON effects (step_id);

CREATE TABLE artifacts (
    task_id       text NOT NULL REFERENCES tasks (id),
    step_id       text NOT NULL REFERENCES steps (id),
    candidate_sha text NOT NULL,
    name          text NOT NULL,
    digest        text NOT NULL,
    PRIMARY KEY (task_id, candidate_sha, name, step_id)
);

-- seq is given by the identity, strictly increasing as AUTOINCREMENT's is in SQLite.
CREATE TABLE events (
    seq       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id   text NOT NULL REFERENCES tasks (id),
    kind      text NOT NULL,
    state     text NOT NULL,
    data_json text NOT NULL,
    at        double precision NOT NULL
);
CREATE INDEX events_by_task ON events (task_id, seq);

-- Refused writes: stale fences, drifted payloads, late transitions. Observable, never a state.
CREATE TABLE rejections (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id text,
    step_id text,
    fence   bigint,
    code    text NOT NULL,
    detail  text NOT NULL,
    at      double precision NOT NULL
);

CREATE TABLE repositories (
    tenant     text NOT NULL,
    name       text NOT NULL,
    head_sha   text NOT NULL,
    updated_at double precision NOT NULL,
    PRIMARY KEY (tenant, name)
);

CREATE TABLE tenants (
    name         text PRIMARY KEY,
    token_budget bigint,                  -- NULL: unlimited
    tokens_used  bigint NOT NULL DEFAULT 0
);

CREATE TABLE tokens (
    id          text PRIMARY KEY,
    scope       text NOT NULL,            -- tenant for operators, pool for runners
    role        text NOT NULL CHECK (role IN ('operator', 'runner')),
    secret_hash text NOT NULL UNIQUE,
    created_at  double precision NOT NULL,
    revoked_at  double precision
);
