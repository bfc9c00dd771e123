-- Release a shared place (a reader, a permit) if the caller still holds it, and wake
-- the waiters.
-- KEYS[1] lock key K (also the wake-up channel), KEYS[2] its holders zset H
-- ARGV[1] owner token, ARGV[2] publish command: PUBLISH or SPUBLISH (cluster), or ''
-- for none, ARGV[3] marker ('~read' or '~permit'), ARGV[4] keep in milliseconds
-- (hold_at_least; '0' or absent: remove the holder now)
-- The holder is removed, or with keep > 0 stays counted until the server's now + keep
-- under its *kept name* (the first 16 hex digits of SHA1('~kept' .. token), as in
-- release.lua) instead of its token, so that no renewal or extend, sent before this
-- release and applied after it, can re-arm the place; a retried release recognises the
-- kept name as its own. Expired holders are reclaimed. K and H then expire with the
-- latest live holder, or are deleted when none is left; K is touched only while it
-- holds the marker (never another holder's value).
-- Publishes on channel K (wake-up payload convention, shared with release.lua and
-- extend.lua):
--   ''  the lock is free: an exclusive release, or the last reader left;
--   'N' (decimal, N >= 1) N places were freed by this call (this holder and expired
--       holders reclaimed) and K is still held: permit waiters may take a place; for
--       readers, sent when K now expires sooner than before (a writer waiting for the
--       readers was told the later expiry);
--   'kept' a holder is kept (keep > 0) and nothing else was announced: its place may
--       now expire sooner than waiters were told, so they ask again;
--   'sooner' a hold was shortened (extend.lua, renew_shared.lua): ask again.
-- Nothing is published when nothing was freed nor kept (a double release), nor when a
-- reader leaves others holding K until as late as before.
-- Returns 1 when released (or kept), 0 when this token holds no unexpired place.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local keep = tonumber(ARGV[4] or '0')
if not keep then
  return redis.error_reply('ERR keep is not a number')
end
local freed = redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local function kept()
  return string.sub(redis.sha1hex('~kept' .. ARGV[1]), 1, 16)
end
local member = ARGV[1]
local score = redis.call('ZSCORE', KEYS[2], member)
if not score then
  member = kept()
  score = redis.call('ZSCORE', KEYS[2], member)
end
local released = 0
if score then
  released = 1
  redis.call('ZREM', KEYS[2], member)
  if keep >= 1 then
    redis.call('ZADD', KEYS[2], now + math.floor(keep), kept())
  else
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
  -- K's expiry was the later of this holder's score and the others' latest: it moved
  -- sooner exactly when the latest score now is below this holder's.
  local sooner = empty or (score and tonumber(last[2]) < tonumber(score))
  if freed > 0 and ARGV[3] == '~read' and empty and ours then
    redis.call(ARGV[2], KEYS[1], '')
  elseif freed > 0 and (ARGV[3] ~= '~read' or (sooner and ours)) then
    redis.call(ARGV[2], KEYS[1], tostring(freed))
  elseif released == 1 and keep >= 1 then
    redis.call(ARGV[2], KEYS[1], 'kept')
  end
end
return released
