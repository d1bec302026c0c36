-- Budgets that count every token (sqlite/0005_usage.sql): the usage each attempt reported.

-- The token counts counted for this attempt; NULL until a result or a release carried usage.
ALTER TABLE attempts ADD COLUMN usage_json text;
