-- Budgets that count every token: the usage each attempt reported, counted once per attempt
-- (keyed by its fence) whether its result committed, was refused (fenced out) or it released.

-- The token counts counted for this attempt; NULL until a result or a release carried usage.
ALTER TABLE attempts ADD COLUMN usage_json TEXT;
