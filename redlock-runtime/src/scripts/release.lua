-- Release a lock if the caller still owns it, and wake the waiters.
-- KEYS[1] lock key (also the wake-up channel)
-- ARGV[1] owner token (16 bytes: only the value's first 16 bytes are compared, see
-- extend.lua), ARGV[2] publish command: PUBLISH or SPUBLISH (cluster), or ''
-- for none (a Redlock undo: waking waiters there would wake the undoing caller itself),
-- ARGV[3] keep in milliseconds (hold_at_least: > 0 keeps the key held until then
-- instead of deleting it; '0' or absent: delete)
-- KEYS[2], KEYS[3] (a fair lock only) its queue and heartbeats (acquire_fair.lua): the
-- places whose heartbeat ran out are dropped, and the wake-up names the first waiter
-- left ('w:' and its id instead of '' or 'kept'), so that it alone asks; '' when none
-- is left.
-- A kept key is held no longer by the token but by its *kept name*, the first 16 hex
-- digits of SHA1('~kept' .. token), the rest of the value (the metadata) unchanged: no
-- extend or renewal can re-arm a released lock (one sent before this release and applied
-- after it finds no token), nobody without the token can name it, and a retried release
-- (its first reply lost) recognises it.
-- Publishes '' on the key's channel when deleted: the lock is free; 'kept' when kept:
-- the key now expires sooner than waiters were told, so they ask again (the payload
-- convention is in release_shared.lua; '' always means free).
-- Returns 1 when released (or kept), 0 when the key was gone, -1 when another token
-- holds it.
local held = redis.call('GET', KEYS[1])
if not held then
  return 0
end
local head = string.sub(held, 1, 16)
if head ~= ARGV[1] then
  -- A retried release of a lock this token kept is released (or kept) again.
  if head ~= string.sub(redis.sha1hex('~kept' .. ARGV[1]), 1, 16) then
    return -1
  end
end
local wake
if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 0 then
  -- Nobody queued: nothing to drop, nobody to name.
  wake = ''
elseif KEYS[2] then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local gone = redis.call('ZRANGE', KEYS[3], '-inf', now, 'BYSCORE')
  for i = 1, #gone, 1000 do
    local part = {unpack(gone, i, math.min(i + 999, #gone))}
    redis.call('ZREM', KEYS[2], unpack(part))
    redis.call('ZREM', KEYS[3], unpack(part))
  end
  local first = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  wake = first and ('w:' .. first) or ''
end
local keep = ARGV[3]
if keep and keep ~= '0' and keep ~= '' then
  if not string.match(keep, '^[1-9][0-9]*$') then
    return redis.error_reply('ERR keep is not a non-negative integer')
  end
  local kept = string.sub(redis.sha1hex('~kept' .. ARGV[1]), 1, 16)
  redis.call('SET', KEYS[1], kept .. string.sub(held, 17), 'PX', keep)
  if ARGV[2] ~= '' then
    redis.call(ARGV[2], KEYS[1], wake or 'kept')
  end
  return 1
end
redis.call('DEL', KEYS[1])
if ARGV[2] ~= '' then
  redis.call(ARGV[2], KEYS[1], wake or '')
end
return 1
