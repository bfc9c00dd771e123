-- Acquire a lock (exclusive, or a read/write lock's writer) and issue its fencing token,
-- in one step.
-- KEYS[1] lock key, KEYS[2] fencing counter of the key's hash slot (shared by every key
-- of the slot, never expires), KEYS[3] the key's writer-intent zset (same slot; may be
-- left out when ARGV[3] is)
-- ARGV[1] owner token, ARGV[2] ttl in milliseconds, ARGV[3] writer id of this wait (''
-- or absent: no writer intent), ARGV[4] intent in milliseconds (the caller's remaining
-- wait), ARGV[5] '1' when this wait registered an intent before (removed on success)
-- Returns the fencing token when acquired: an integer while a Lua number holds the
-- counter exactly (below 2^53), else the counter read back as its decimal digits (a
-- Lua number's double is inexact above 2^53). A retried call that finds its own token
-- is granted too, its expiry reset to the ttl as a fresh grant would be.
-- Returns {pttl, holder} when someone else holds the lock (pttl -1: held without
-- expiry); holder is 16 hex digits of the SHA1 of the holder's value, the same on every
-- node one holder holds (Redlock tells a majority holder from a split vote by it), and
-- nothing anyone could use to release or extend that lock. Readers hold it as the value
-- '~read', so their holder digest is that of '~read'.
-- Held, with a writer id and a positive intent: the id is added to KEYS[3] with score =
-- the server's now (TIME, milliseconds) + ARGV[4], but at most KEYS[1]'s PTTL + 2000
-- (the writer, told that PTTL, asks again by then, or sooner when woken, renewing its
-- intent; one whose writer died runs out soon, not at the end of its wait), expired
-- intents dropped, and KEYS[3] expires with its last intent; new readers are refused while an intent is unexpired
-- (acquire_shared.lua). Every held reply to a call with a writer id means its intent is
-- registered, whoever holds the lock.
-- Fails, the lock given back, when the counter does not yield a positive integer
-- (not an integer, zero or negative, or INCR overflowing at 2^63 - 1).

-- The counter's decimal digits, or the lock given back and an error.
local function read_back()
  local fence = redis.pcall('GET', KEYS[2])
  if type(fence) == 'string' and string.match(fence, '^[1-9][0-9]*$') then
    return fence
  end
  redis.call('DEL', KEYS[1])
  if type(fence) == 'table' and fence.err then
    return redis.error_reply('ERR fencing counter ' .. KEYS[2] .. ': ' .. fence.err)
  end
  return redis.error_reply('ERR fencing counter ' .. KEYS[2] .. ' holds no positive integer')
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local n = redis.pcall('INCR', KEYS[2])
  if type(n) == 'table' then
    redis.call('DEL', KEYS[1])
    return redis.error_reply('ERR fencing counter ' .. KEYS[2] .. ': ' .. n.err)
  end
  if ARGV[5] == '1' then
    redis.call('ZREM', KEYS[3], ARGV[3])
  end
  if n >= 1 and n < 9007199254740992 then
    return n
  end
  return read_back()
end
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if ARGV[5] == '1' then
    redis.call('ZREM', KEYS[3], ARGV[3])
  end
  return read_back()
end
local holder = ''
if held then
  holder = string.sub(redis.sha1hex(held), 1, 16)
end
local pttl = redis.call('PTTL', KEYS[1])
if held and ARGV[3] and ARGV[3] ~= '' then
  local intent = tonumber(ARGV[4])
  if not intent then
    return redis.error_reply('ERR writer intent ms is not a number')
  end
  if intent >= 1 then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local ms = math.floor(intent)
    if pttl > 0 and pttl + 2000 < ms then
      ms = pttl + 2000
    end
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
    redis.call('ZADD', KEYS[3], now + ms, ARGV[3])
    local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
    redis.call('PEXPIRE', KEYS[3], tonumber(last[2]) - now)
  end
end
return {pttl, holder}
