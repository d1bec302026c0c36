-- Issue 14: the artifact store's bytes in the ledger's database, so that every supervisor on
-- it reads what any of them stored (supervisor/artifacts/pg.py). A digest's bytes are its
-- chunks 0..k in order, each at most 1 MiB; an empty artifact is one empty chunk 0. The
-- chunks of a digest are written in one transaction, committed only once the bytes hash to
-- it, and never changed after.
CREATE TABLE artifact_chunks (
    digest text NOT NULL,
    n      bigint NOT NULL,
    data   bytea NOT NULL,
    PRIMARY KEY (digest, n)
);
-- Out of line and not compressed: git bundles are compressed already, and pglz would spend a
-- supervisor's database CPU on every chunk of every upload.
ALTER TABLE artifact_chunks ALTER COLUMN data SET STORAGE EXTERNAL;
