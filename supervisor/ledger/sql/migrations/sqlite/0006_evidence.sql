-- Issue 12's evidence: the checks a task names with their commands, what each step of a
-- repository-bound task reported (its bundle, its check runs) and what the supervisor's
-- adapters observed about that report (the head, the problems), and each step's last
-- accepted checkpoint (docs/design.md, Verification).

-- The task's checks in order, [{"name", "command"}]; their names are its expected checks.
ALTER TABLE tasks ADD COLUMN checks_json TEXT NOT NULL DEFAULT '[]';

-- The digest of the bundle `start_sha..candidate_sha` the committed report named.
ALTER TABLE steps ADD COLUMN bundle TEXT;
-- What the adapters observed about the committed report: {"head_sha", "problems": [{"code",
-- "detail"}]}; NULL for a step of a task without a repository.
ALTER TABLE steps ADD COLUMN evidence_json TEXT;

-- The checks the committed report of a step ran, one row per check. A table rather than a
-- JSON column: verification, the review record and the `success-is-verified` invariant all
-- look a check up by (candidate, name), which is a plain indexed query here.
CREATE TABLE check_runs (
    step_id       TEXT NOT NULL REFERENCES steps (id),
    name          TEXT NOT NULL,
    candidate_sha TEXT NOT NULL,
    log_digest    TEXT NOT NULL,
    exit_code     INTEGER NOT NULL,
    duration_s    REAL NOT NULL,
    PRIMARY KEY (step_id, name)
) STRICT;
CREATE INDEX check_runs_by_candidate ON check_runs (candidate_sha, name);

-- The latest accepted checkpoint of each step (one row per step, replaced by a later turn):
-- a replayed attempt's lease carries it as its resume point.
CREATE TABLE checkpoints (
    step_id         TEXT PRIMARY KEY REFERENCES steps (id),
    fence           INTEGER NOT NULL,
    turn            INTEGER NOT NULL,
    transcript      TEXT NOT NULL,
    bundle          TEXT,
    sha             TEXT,
    step_usage_json TEXT NOT NULL DEFAULT '{}',
    created_at      REAL NOT NULL
) STRICT;
