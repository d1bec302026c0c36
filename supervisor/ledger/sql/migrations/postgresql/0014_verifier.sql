-- Issue 22, item 2 (sqlite/0014_verifier.sql): checks re-run by a verifier.

-- The pool whose runners re-run the task's checks; NULL: no verifier.
ALTER TABLE tasks ADD COLUMN verify_pool text;

-- A tenant's default verifier pool; NULL: none.
ALTER TABLE tenants ADD COLUMN verify_pool text;

-- A built-in `verify` step: the candidate SHA it re-checks (NULL for a plan's steps).
ALTER TABLE steps ADD COLUMN verifies text;
CREATE INDEX steps_verifying ON steps (bundle) WHERE verifies IS NOT NULL;
