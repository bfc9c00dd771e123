-- Acquire a lock and issue its fencing token, in one step.
-- KEYS[1] lock key, KEYS[2] fencing counter (same hash tag, never expires)
-- ARGV[1] owner token, ARGV[2] ttl in milliseconds
-- Returns {1, fence} when acquired (also when a retried call finds its own token),
-- {0, pttl} when someone else holds the lock (pttl -1: held without expiry), and an
-- error (the lock given back) when the counter does not yield a positive integer.
local function issued(fence)
  -- A tampered counter (negative, zero, not a number) would hand out a token that
  -- fences nothing: fail clearly instead.
  if type(fence) == 'number' and fence >= 1 then
    return {1, fence}
  end
  redis.call('DEL', KEYS[1])
  return redis.error_reply('ERR fencing counter ' .. KEYS[2] .. ' holds no positive integer')
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local fence = redis.pcall('INCR', KEYS[2])
  if type(fence) == 'table' then
    redis.call('DEL', KEYS[1])
    return fence
  end
  return issued(fence)
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return issued(tonumber(redis.call('GET', KEYS[2])))
end
return {0, redis.call('PTTL', KEYS[1])}
