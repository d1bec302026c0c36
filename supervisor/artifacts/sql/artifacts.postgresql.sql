-- The PostgreSQL artifact store's statements (supervisor/artifacts/pg.py). Not in the ledger's
-- sql/queries/: a SQLite ledger keeps its artifacts in files and never runs them.

-- name: put_artifact_chunk
-- Write one chunk of a checked upload, in the transaction that writes all of its chunks.
INSERT INTO artifact_chunks (digest, n, data) VALUES (:digest, :n, :data);

-- name: artifact_stored
-- Whether a digest's bytes are stored (every stored digest has a chunk 0).
SELECT EXISTS (SELECT 1 FROM artifact_chunks WHERE digest = :digest AND n = 0);

-- name: artifact_chunk
-- One chunk of a stored digest; none past its last.
SELECT data FROM artifact_chunks WHERE digest = :digest AND n = :n;

-- name: artifact_size
-- A stored digest's size in bytes: NULL when none is stored.
SELECT sum(octet_length(data)) FROM artifact_chunks WHERE digest = :digest;

-- name: remove_unowned_artifact
-- Remove a digest's chunks once no owner row names it (the collector's; an upload that
-- recorded an owner meanwhile keeps them).
DELETE FROM artifact_chunks WHERE digest = :digest
AND NOT EXISTS (SELECT 1 FROM artifact_owners WHERE digest = :digest);
