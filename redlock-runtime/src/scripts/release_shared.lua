-- Release a shared place (a reader, a permit) if the caller still holds it, and wake
-- the waiters.
-- KEYS[1] lock key K (also the wake-up channel), KEYS[2] its holders zset H
-- ARGV[1] owner token, ARGV[2] publish command: PUBLISH or SPUBLISH (cluster), or ''
-- for none, ARGV[3] marker ('~read' or '~permit'), ARGV[4] keep in milliseconds
-- (hold_at_least; '0' or absent: remove the holder now)
-- The holder is removed, or with keep > 0 stays counted until the server's now + keep
-- (its score set to that, longer or shorter). Expired holders are reclaimed. K and H then
-- expire with the latest live holder, or are deleted when none is left; K is touched
-- only while it holds the marker (never another holder's value).
-- Publishes on channel K (wake-up payload convention, shared with release.lua):
--   ''  the lock is free: an exclusive release, or the last reader left (readers publish
--       nothing else: only writers wait for readers, and they need the lock empty);
--   'N' (decimal, N >= 1) permits: N places were freed by this call (this holder and
--       expired holders reclaimed), K possibly still held by other permit holders;
--   'kept' a holder is kept (keep > 0) and nothing else was announced: its place may
--       now expire sooner than waiters were told, so they ask again.
-- Nothing is published when nothing was freed nor kept (a double release).
-- Returns 1 when released (or kept), 0 when this token holds no unexpired place.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local keep = tonumber(ARGV[4] or '0')
if not keep then
  return redis.error_reply('ERR keep is not a number')
end
local freed = redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local released = 0
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  released = 1
  if keep >= 1 then
    redis.call('ZADD', KEYS[2], now + math.floor(keep), ARGV[1])
  else
    redis.call('ZREM', KEYS[2], ARGV[1])
    freed = freed + 1
  end
end
if freed == 0 and released == 0 then
  return 0
end
-- K holds the marker alone, or padded to 16 bytes with '~' and followed by metadata
-- (acquire_shared.lua).
local k = redis.call('GET', KEYS[1])
local ours = k == ARGV[3]
  or (type(k) == 'string' and string.sub(k, 1, 16) == ARGV[3] .. string.rep('~', 16 - #ARGV[3]))
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
local empty = last[1] == nil
if empty then
  redis.call('DEL', KEYS[2])
  if ours then
    redis.call('DEL', KEYS[1])
  end
else
  local ms = tonumber(last[2]) - now
  redis.call('PEXPIRE', KEYS[2], ms)
  if ours then
    redis.call('PEXPIRE', KEYS[1], ms)
  end
end
if ARGV[2] ~= '' then
  if freed > 0 and ARGV[3] ~= '~read' then
    redis.call(ARGV[2], KEYS[1], tostring(freed))
  elseif freed > 0 and empty and ours then
    redis.call(ARGV[2], KEYS[1], '')
  elseif released == 1 and keep >= 1 then
    redis.call(ARGV[2], KEYS[1], 'kept')
  end
end
return released
