-- The repositories the supervisor knows (sqlite/0003_repositories.sql): where each is read
-- from. The `repositories` table keeps, as before, the head each one last reported.
CREATE TABLE repository_remotes (
    tenant   text NOT NULL,
    name     text NOT NULL,
    url      text NOT NULL,
    added_at double precision NOT NULL,
    PRIMARY KEY (tenant, name)
);
