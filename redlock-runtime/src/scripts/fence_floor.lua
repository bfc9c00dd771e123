-- Raise a lock's fencing counter to at least a floor, while the caller holds the lock
-- (Redlock: the nodes of a quorum catch up with the token issued, see backend/redlock.rs).
-- KEYS[1] lock key, KEYS[2] fencing counter (same hash tag, never expires)
-- ARGV[1] owner token, ARGV[2] floor (the fencing token issued)
-- Returns 1 when the counter is now at least the floor, 0 when the lock is not ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local floor = tonumber(ARGV[2])
  if (tonumber(redis.call('GET', KEYS[2])) or 0) < floor then
    redis.call('SET', KEYS[2], ARGV[2])
  end
  return 1
end
return 0
