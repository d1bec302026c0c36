-- Issue 22: a repository's setup commands (sqlite/0013_repository_setup.sql), a JSON list of
-- command lines; `[]` for none.
ALTER TABLE repository_remotes ADD COLUMN setup_json text NOT NULL DEFAULT '[]';
