-- name: live_token_named
-- The live (not revoked) token holding a name, if any: a new token's name must be free.
SELECT id FROM tokens WHERE name = :name AND revoked_at IS NULL;

-- name: insert_token
-- Store a new token: only its secret's sha256, never the secret.
INSERT INTO tokens (id, scope, role, secret_hash, created_at, name) VALUES (:token_id, :scope, :role, :secret_hash, :now, :name);

-- name: token_by_id
-- A token by its id, revoked or not.
SELECT * FROM tokens WHERE id = :token_id;

-- name: token_by_name
-- The tokens holding a name, the live one first, then the newest revoked.
SELECT * FROM tokens WHERE name = :name ORDER BY revoked_at IS NULL DESC, created_at DESC;

-- name: revoke_token
-- Revoke a token; revoking it again keeps the first revocation's time.
UPDATE tokens SET revoked_at = COALESCE(revoked_at, :now) WHERE id = :token_id;

-- name: list_tokens
-- Every token, oldest first (`token list`).
SELECT * FROM tokens ORDER BY created_at, id;

-- name: live_token_by_secret_hash
-- The live token whose secret hashes to this: who a request's bearer is.
SELECT id, scope, role, last_used_at FROM tokens WHERE secret_hash = :secret_hash AND revoked_at IS NULL;

-- name: note_token_use
-- Stamp a token's last use, unless one stored is newer than the given cut-off.
UPDATE tokens SET last_used_at = :now
WHERE id = :token_id AND (last_used_at IS NULL OR last_used_at <= :used_before);
