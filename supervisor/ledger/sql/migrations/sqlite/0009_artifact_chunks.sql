-- Issue 14: PostgreSQL's 0009 keeps the artifact store's bytes in the database. A SQLite
-- ledger keeps them in files under `artifact_dir` (supervisor/artifacts/store.py) and leaves
-- this table empty; it exists so that version 9 holds the same tables on both backends (the
-- copy to PostgreSQL fills PostgreSQL's from the files: supervisor/ledger/copy.py).
CREATE TABLE artifact_chunks (
    digest TEXT NOT NULL,
    n      INTEGER NOT NULL,
    data   BLOB NOT NULL,
    PRIMARY KEY (digest, n)
) STRICT;
