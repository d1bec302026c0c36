-- The artifact store (sqlite/0004_artifacts.sql): who may read each stored digest. Each row
-- says that a token of this role and scope (an operator's tenant, a runner's pool) uploaded
-- those bytes.
CREATE TABLE artifact_owners (
    digest     text NOT NULL,
    role       text NOT NULL,
    scope      text NOT NULL,
    size       bigint NOT NULL,
    token_id   text,
    created_at double precision NOT NULL,
    PRIMARY KEY (digest, role, scope)
);
