-- name: raise_fence_floor
-- Move the fence sequence above every fence granted and to at least the floor given.
SELECT setval('fences', GREATEST(
    (SELECT last_value FROM fences), (SELECT COALESCE(MAX(fence), 0) FROM attempts), :floor::bigint
));
