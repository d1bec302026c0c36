-- Issue 26: the lines a runner wrote about an attempt, shipped to the owned box so that a
-- step's story outlives the borrowed server (supervisor/ledger/logs.py). Kept only under a
-- fence granted to the token that sent them, at most LINES_PER_ATTEMPT per fence. `after_seq`
-- is the task's last journal seq when the line arrived: a line sorts after that event and
-- before the next, then by `id` (receipt order), never by the runner's clock. `at` is the
-- supervisor's clock.
CREATE TABLE log_lines (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id     text NOT NULL REFERENCES tasks (id),
    step_id     text NOT NULL,
    fence       bigint NOT NULL,
    after_seq   bigint NOT NULL,
    level       text NOT NULL,
    event       text NOT NULL,
    fields_json text NOT NULL,
    at          double precision NOT NULL
);
CREATE INDEX log_lines_by_task ON log_lines (task_id, id);
CREATE INDEX log_lines_by_fence ON log_lines (fence);
