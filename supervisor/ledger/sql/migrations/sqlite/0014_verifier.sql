-- Issue 22, item 2 (docs/design.md, Verification): checks re-run by a verifier, a runner of
-- another pool than the one that made the candidate.

-- The pool whose runners re-run the task's checks at its candidate (the create body's
-- `verify.pool`, else its tenant's default when the task has checks); NULL: no verifier.
ALTER TABLE tasks ADD COLUMN verify_pool TEXT;

-- A tenant's default verifier pool (`tether-supervisor tenant --verify-pool`); NULL: none.
ALTER TABLE tenants ADD COLUMN verify_pool TEXT;

-- A built-in `verify` step: the candidate SHA it re-checks (NULL for a plan's steps). Such a
-- step is leased to the runners of its task's `verify_pool`, and keeps in `bundle` the digest
-- of the candidate's bundle it reads.
ALTER TABLE steps ADD COLUMN verifies TEXT;
CREATE INDEX steps_verifying ON steps (bundle) WHERE verifies IS NOT NULL;
