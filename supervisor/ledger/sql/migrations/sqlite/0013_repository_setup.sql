-- Issue 22: a repository's setup commands (`tether-supervisor repo add --setup`), a JSON list
-- of command lines that each agent step of its tasks runs in its worktree before the first
-- model call (runner/agent/setup.py); `[]` for none.
ALTER TABLE repository_remotes ADD COLUMN setup_json TEXT NOT NULL DEFAULT '[]';
