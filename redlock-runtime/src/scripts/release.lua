-- Release a lock if the caller still owns it, and wake the waiters.
-- KEYS[1] lock key (also the wake-up channel)
-- ARGV[1] owner token, ARGV[2] publish command: PUBLISH or SPUBLISH (cluster), or ''
-- for none (a Redlock undo: waking waiters there would wake the undoing caller itself)
-- Returns 1 when released, 0 when the key was gone, -1 when another token holds it.
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
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
