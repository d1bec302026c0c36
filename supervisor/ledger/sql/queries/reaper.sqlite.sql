-- name: raise_fence_floor
-- Move the fence counter above every fence granted and to at least the floor given.
UPDATE counters SET value = MAX(value, (SELECT COALESCE(MAX(fence), 0) FROM attempts), :floor)
WHERE name = 'fence';
