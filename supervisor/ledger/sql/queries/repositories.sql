-- name: insert_repository_remote
-- Record the git URL a tenant's repository is read from, and its setup commands.
INSERT INTO repository_remotes (tenant, name, url, added_at, setup_json) VALUES (:tenant, :name, :url, :now, :setup_json);

-- name: update_repository_setup
-- Replace a tenant's repository's setup commands.
UPDATE repository_remotes SET setup_json = :setup_json WHERE tenant = :tenant AND name = :name;

-- name: task_keeping_repository
-- A task of the tenant's repository that has not ended, the oldest: it keeps the repository.
SELECT id FROM tasks WHERE tenant = :tenant AND repository = :name
AND state NOT IN ({TaskState.SUCCEEDED}, {TaskState.FAILED}, {TaskState.CANCELLED})
ORDER BY created_order LIMIT 1;

-- name: delete_repository_remote
-- Forget a tenant's repository.
DELETE FROM repository_remotes WHERE tenant = :tenant AND name = :name;

-- name: repository_remote
-- A tenant's repository by name.
SELECT * FROM repository_remotes WHERE tenant = :tenant AND name = :name;

-- name: all_repository_remotes
-- Every repository known, by tenant and name.
SELECT * FROM repository_remotes ORDER BY tenant, name;

-- name: repository_remotes_of_tenant
-- A tenant's repositories, by name.
SELECT * FROM repository_remotes WHERE tenant = :tenant ORDER BY tenant, name;

-- name: task_row_of_step
-- The whole row of a step's task, with the candidate the step verifies (a verify step's) and the step's pool (its task's, or for a verify step its verifier pool).
SELECT t.*, s.verifies,
    (CASE WHEN s.verifies IS NULL THEN t.pool ELSE t.verify_pool END) AS step_pool
FROM steps s JOIN tasks t ON t.id = s.task_id WHERE s.id = :step_id;

-- name: committed_candidates_of_url
-- Every committed candidate with its bundle, of the tasks of each repository read from a URL.
SELECT e.task_id, e.step_id, e.fence, s.candidate_sha, s.bundle
FROM effects e JOIN steps s ON s.id = e.step_id JOIN tasks t ON t.id = e.task_id
JOIN repository_remotes r ON r.tenant = t.tenant AND r.name = t.repository
WHERE r.url = :url AND s.candidate_sha IS NOT NULL AND s.bundle IS NOT NULL
ORDER BY e.task_id, e.step_id;
