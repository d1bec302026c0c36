-- The invariants whose text differs by backend (invariants.sql says how they are named).

-- name: fence_counter_ahead
-- The fence counter, if it is below a fence already granted.
SELECT x.counter, x.top FROM (
    SELECT (SELECT value FROM counters WHERE name = 'fence') AS counter,
        (SELECT MAX(fence) FROM attempts) AS top
) x
WHERE x.counter < x.top;

-- name: success_is_verified
-- Succeeded repository tasks whose final candidate (the latest step's with one) lacks evidence, has problems, or lacks a passing run of an expected check.
SELECT t.id FROM tasks t LEFT JOIN steps f ON f.id = (SELECT s.id FROM steps s
    WHERE s.task_id = t.id AND s.candidate_sha IS NOT NULL ORDER BY s.position DESC LIMIT 1)
WHERE t.state = {TaskState.SUCCEEDED} AND t.repository IS NOT NULL AND (
    f.id IS NULL OR f.evidence_json IS NULL
    OR json_array_length(f.evidence_json, '$.problems') > 0
    OR EXISTS (SELECT 1 FROM json_each(t.expected_checks_json) c WHERE NOT EXISTS (
        SELECT 1 FROM check_runs r JOIN steps s ON s.id = r.step_id WHERE s.task_id = t.id
        AND r.name = c.value AND r.candidate_sha = f.candidate_sha AND r.exit_code = 0)));

-- name: success_on_approved_base
-- Succeeded repository tasks whose repository's head last moved, after their approval and before their success, off their approved base (and not to the SHA their own git.push sent).
SELECT t.id FROM tasks t JOIN events v ON v.task_id = t.id AND v.kind = 'state'
    AND v.state = {TaskState.SUCCEEDED}
WHERE t.repository IS NOT NULL AND EXISTS (
    SELECT 1 FROM events b WHERE b.task_id = t.id AND b.kind = 'base_changed'
    AND b.seq < v.seq AND json_extract(b.data_json, '$.head_sha') != t.approved_base_sha
    AND json_extract(b.data_json, '$.head_sha') IS NOT t.pushed_sha
    AND b.seq > (SELECT MAX(a.seq) FROM events a WHERE a.task_id = t.id
        AND a.kind = 'state' AND a.state = {TaskState.APPROVED})
    AND NOT EXISTS (SELECT 1 FROM events b2 WHERE b2.task_id = t.id
        AND b2.kind = 'base_changed' AND b2.seq > b.seq AND b2.seq < v.seq));
