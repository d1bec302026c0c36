-- Issue 12's evidence (sqlite/0006_evidence.sql): the checks a task names, what each step of a
-- repository-bound task reported and what the adapters observed, and each step's last
-- accepted checkpoint.

-- The task's checks in order, [{"name", "command"}]; their names are its expected checks.
ALTER TABLE tasks ADD COLUMN checks_json text NOT NULL DEFAULT '[]';

-- The digest of the bundle `start_sha..candidate_sha` the committed report named.
ALTER TABLE steps ADD COLUMN bundle text;
-- What the adapters observed about the committed report: {"head_sha", "problems": [...]}.
ALTER TABLE steps ADD COLUMN evidence_json text;

-- The checks the committed report of a step ran, one row per check.
CREATE TABLE check_runs (
    step_id       text NOT NULL REFERENCES steps (id),
    name          text NOT NULL,
    candidate_sha text NOT NULL,
    log_digest    text NOT NULL,
    exit_code     bigint NOT NULL,
    duration_s    double precision NOT NULL,
    PRIMARY KEY (step_id, name)
);
CREATE INDEX check_runs_by_candidate ON check_runs (candidate_sha, name);

-- The latest accepted checkpoint of each step (one row per step, replaced by a later turn).
CREATE TABLE checkpoints (
    step_id         text PRIMARY KEY REFERENCES steps (id),
    fence           bigint NOT NULL,
    turn            bigint NOT NULL,
    transcript      text NOT NULL,
    bundle          text,
    sha             text,
    step_usage_json text NOT NULL DEFAULT '{}',
    created_at      double precision NOT NULL
);
