-- The artifact store (docs/design.md, Artifacts): who may read each stored digest. The bytes
-- live in files under the setting `artifact_dir`, one per digest; each row says that a token
-- of this role and scope (an operator's tenant, a runner's pool) uploaded those bytes. (The
-- `artifacts` table of 0001 holds the digests a step's result named, not who uploaded them.)
CREATE TABLE artifact_owners (
    digest     TEXT NOT NULL,
    role       TEXT NOT NULL,
    scope      TEXT NOT NULL,
    size       INTEGER NOT NULL,
    token_id   TEXT,
    created_at REAL NOT NULL,
    PRIMARY KEY (digest, role, scope)
) STRICT;
