-- Raise the fencing counter of a lock's slot to at least a floor, while the caller holds
-- the lock (Redlock: the nodes of a quorum catch up with the token issued, see
-- backend/redlock.rs).
-- KEYS[1] lock key, KEYS[2] fencing counter of the key's hash slot (never expires),
-- KEYS[3] the key's holders zset (shared holders only, see acquire_shared.lua)
-- ARGV[1] owner token, ARGV[2] floor (the fencing token issued, a decimal string),
-- ARGV[3] marker of a shared holder ('~read' or '~permit'; absent: exclusive holder)
-- The caller holds the lock when KEYS[1] holds its token, or (shared, ARGV[3] given) when
-- KEYS[1] holds the marker and the token is in KEYS[3] unexpired (the server's clock).
-- Returns 1 when the counter is now at least the floor, 0 when the lock is not ours, an
-- error when the floor or the counter is not a decimal integer (the counter untouched).
-- Counters are compared as decimal strings, never as Lua numbers: doubles are inexact
-- above 2^53.
local function decimal(s)
  return type(s) == 'string' and (s == '0' or string.match(s, '^[1-9][0-9]*$') ~= nil)
end
-- a < b for decimal strings without leading zeros: shorter is smaller, then bytewise.
local function less(a, b)
  if #a ~= #b then
    return #a < #b
  end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return false
end
-- K's value: the token, or the marker padded to 16 bytes with '~', followed by
-- metadata; or the token or marker alone, written before the metadata existed.
local held = redis.call('GET', KEYS[1])
if ARGV[3] then
  local padded = ARGV[3] .. string.rep('~', 16 - #ARGV[3])
  if held ~= ARGV[3] and not (held and string.sub(held, 1, 16) == padded) then
    return 0
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local score = redis.call('ZSCORE', KEYS[3], ARGV[1])
  if not score or tonumber(score) <= now then
    return 0
  end
elseif not (held and string.sub(held, 1, 16) == ARGV[1]) then
  return 0
end
local floor = ARGV[2]
if not decimal(floor) then
  return redis.error_reply('ERR fencing floor is not a decimal integer')
end
local counter = redis.call('GET', KEYS[2])
if counter == false then
  counter = '0'
end
if not decimal(counter) then
  return redis.error_reply('ERR fencing counter ' .. KEYS[2] .. ' holds no non-negative integer')
end
if less(counter, floor) then
  redis.call('SET', KEYS[2], floor)
end
return 1
