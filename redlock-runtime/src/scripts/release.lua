-- Release a lock if the caller still owns it, and wake the waiters.
-- KEYS[1] lock key (also the wake-up channel)
-- ARGV[1] owner token (16 bytes: only the value's first 16 bytes are compared, see
-- extend.lua), ARGV[2] publish command: PUBLISH or SPUBLISH (cluster), or ''
-- for none (a Redlock undo: waking waiters there would wake the undoing caller itself),
-- ARGV[3] keep in milliseconds (hold_at_least: > 0 keeps the key held by this token
-- until then instead of deleting it; '0' or absent: delete)
-- Publishes '' on the key's channel when deleted: the lock is free; 'kept' when kept:
-- the key now expires sooner than waiters were told, so they ask again (the payload
-- convention is in release_shared.lua; '' always means free).
-- Returns 1 when released (or kept), 0 when the key was gone, -1 when another token
-- holds it.
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, 16) == ARGV[1] then
  local keep = ARGV[3]
  if keep and keep ~= '0' and keep ~= '' then
    if not string.match(keep, '^[1-9][0-9]*$') then
      return redis.error_reply('ERR keep is not a non-negative integer')
    end
    redis.call('PEXPIRE', KEYS[1], keep)
    if ARGV[2] ~= '' then
      redis.call(ARGV[2], KEYS[1], 'kept')
    end
    return 1
  end
  redis.call('DEL', KEYS[1])
  if ARGV[2] ~= '' then
    redis.call(ARGV[2], KEYS[1], '')
  end
  return 1
end
if held then
  return -1
end
return 0
