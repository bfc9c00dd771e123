-- An operator's force-unlock: delete a lock whoever holds it, or only while no grant
-- later than the one the operator was shown holds it; and wake the waiters.
-- KEYS[1] lock key K (also the wake-up channel), KEYS[2] its holders zset H, KEYS[3] its
-- writers' intents (same slot)
-- ARGV[1] publish command: PUBLISH or SPUBLISH (cluster)
-- ARGV[2] the holder shown, or '' for anyone: 16 hex digits of the SHA1 of K's first 16
-- bytes, as inspect.lua names a holder
-- ARGV[3] the fencing token shown, or '' for any: K's metadata naming a greater one (a
-- grant after it: tokens only grow) is another grant
-- Returns 1 when something was deleted, 0 when nothing was there, -1 when another grant
-- holds K (nothing deleted).
-- Tokens are compared as decimal text (by length, then bytes), never as Lua numbers
-- (doubles: not exact above 2^53).
local function later(fence, shown)
  if #fence ~= #shown then
    return #fence > #shown
  end
  return fence > shown
end
if ARGV[2] ~= '' or ARGV[3] ~= '' then
  local v = redis.pcall('GET', KEYS[1])
  if type(v) ~= 'string' then
    return 0
  end
  if ARGV[2] ~= '' and string.sub(redis.sha1hex(string.sub(v, 1, 16)), 1, 16) ~= ARGV[2] then
    return -1
  end
  -- The metadata after the 16-byte head: '|1|<ms>|<fence>|...' (see inspect.lua).
  local fence = string.match(v, '^|1|%d*|(%d+)', 17)
  if ARGV[3] ~= '' and fence and later(fence, ARGV[3]) then
    return -1
  end
end
local deleted = redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
if deleted == 0 then
  return 0
end
redis.call(ARGV[1], KEYS[1], '')
return 1
