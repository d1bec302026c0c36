-- The repositories the supervisor knows (`tether-supervisor repo add`): where each is read
-- from. The `repositories` table keeps, as before, the head each one last reported.
CREATE TABLE repository_remotes (
    tenant   TEXT NOT NULL,
    name     TEXT NOT NULL,
    url      TEXT NOT NULL,
    added_at REAL NOT NULL,
    PRIMARY KEY (tenant, name)
) STRICT;
