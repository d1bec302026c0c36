-- Issue 13, after review (docs/design.md, Effects).

-- The candidate a `git.push` of the task began to push, written with the attempt's row before
-- anything is sent: a head read that reports it (the forge's webhook, another claim's head
-- read) is the task's own push, not a moved base, and does not fail the task `stale_base`.
ALTER TABLE tasks ADD COLUMN pushed_sha TEXT;

-- Delivery attempts numbered up to this one were settled by an operator's word (`happened
-- yes|no`): none of them counts any more as an attempt that may have sent.
ALTER TABLE outbox ADD COLUMN settled_attempts INTEGER NOT NULL DEFAULT 0;
