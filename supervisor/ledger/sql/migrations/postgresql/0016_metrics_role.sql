-- A third token role, `metrics` (sqlite/0016_metrics_role.sql): the only one `GET /metrics`
-- answers (tenant names and their spend are not public).
ALTER TABLE tokens DROP CONSTRAINT tokens_role_check;
ALTER TABLE tokens ADD CONSTRAINT tokens_role_check
    CHECK (role IN ('operator', 'runner', 'metrics'));
