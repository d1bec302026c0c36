-- Issue 26: the lines a runner wrote about an attempt, shipped to the owned box so that a
-- step's story outlives the borrowed server (supervisor/ledger/logs.py). Kept only under a
-- fence granted to the token that sent them, at most LINES_PER_ATTEMPT per fence. `after_seq`
-- is the task's last journal seq when the line arrived: a line sorts after that event and
-- before the next, then by `id` (receipt order), never by the runner's clock. `at` is the
-- supervisor's clock.
CREATE TABLE log_lines (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id     TEXT NOT NULL REFERENCES tasks (id),
    step_id     TEXT NOT NULL,
    fence       INTEGER NOT NULL,
    after_seq   INTEGER NOT NULL,
    level       TEXT NOT NULL,
    event       TEXT NOT NULL,
    fields_json TEXT NOT NULL,
    at          REAL NOT NULL
) STRICT;
CREATE INDEX log_lines_by_task ON log_lines (task_id, id);
CREATE INDEX log_lines_by_fence ON log_lines (fence);
