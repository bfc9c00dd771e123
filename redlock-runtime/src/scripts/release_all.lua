-- Release several exclusive locks held by one token (a lock_all guard), and wake their
-- waiters: release.lua for each key, in one call.
-- KEYS[1..n] lock keys (each also its wake-up channel)
-- ARGV[1] owner token, ARGV[2] publish command: PUBLISH or SPUBLISH (cluster), or '' for
-- none, ARGV[3] keep in milliseconds (hold_at_least: > 0 keeps each key held until then,
-- publishing nothing; '0' or absent: delete)
-- Publishes '' (the lock is free) on each key deleted.
-- Returns one integer per key as release.lua: 1 released, 0 gone, -1 another token holds
-- it.
local keep = tonumber(ARGV[3] or '0')
if not keep then
  return redis.error_reply('ERR keep is not a number')
end
local out = {}
for i, key in ipairs(KEYS) do
  local held = redis.call('GET', key)
  if held == ARGV[1] then
    if keep >= 1 then
      redis.call('PEXPIRE', key, math.floor(keep))
    else
      redis.call('DEL', key)
      if ARGV[2] ~= '' then
        redis.call(ARGV[2], key, '')
      end
    end
    out[i] = 1
  elseif held then
    out[i] = -1
  else
    out[i] = 0
  end
end
return out
