-- Acquire a lock and issue its fencing token, in one step.
-- KEYS[1] lock key, KEYS[2] fencing counter (same hash tag, never expires)
-- ARGV[1] owner token, ARGV[2] ttl in milliseconds
-- Returns {1, fence} when acquired (also when a retried call finds its own token),
-- {0, pttl} when someone else holds the lock (pttl -1: held without expiry).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local fence = redis.pcall('INCR', KEYS[2])
  if type(fence) == 'table' then
    redis.call('DEL', KEYS[1])
    return fence
  end
  return {1, fence}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return {1, tonumber(redis.call('GET', KEYS[2])) or 0}
end
return {0, redis.call('PTTL', KEYS[1])}
