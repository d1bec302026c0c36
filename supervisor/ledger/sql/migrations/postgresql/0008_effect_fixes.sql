-- Issue 13, after review (sqlite/0008_effect_fixes.sql).

-- The candidate a `git.push` of the task began to push, written with the attempt's row before
-- anything is sent: a head read that reports it is the task's own push, not a moved base.
ALTER TABLE tasks ADD COLUMN pushed_sha text;

-- Delivery attempts numbered up to this one were settled by an operator's word (`happened
-- yes|no`): none of them counts any more as an attempt that may have sent.
ALTER TABLE outbox ADD COLUMN settled_attempts bigint NOT NULL DEFAULT 0;
