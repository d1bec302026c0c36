-- Issue 14: statistics on the queues kept current. The claim's plan depends on them: planned
-- on a `steps` table never analyzed, or analyzed while it was nearly empty, the claim sorted
-- the whole queue at every claim (32 ms at 4,000 queued steps, 0.03 ms once analyzed;
-- bench/pg.py). By default autovacuum analyzes a table once 10% of its rows changed, so a
-- burst of queued steps after a quiet period on a large table waited a long time for it.
-- Here a fixed 500 changed rows suffice whatever the table's size; autovacuum looks at
-- each database every `autovacuum_naptime` (a server setting, 1 min by default), which
-- bounds how soon. The same for the effects' `outbox`, which the dispatcher's take reads
-- in order. Storage parameters only: no data changes, and SQLite's 0010 is a no-op.
ALTER TABLE steps SET (autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 500);
ALTER TABLE outbox SET (autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 500);
