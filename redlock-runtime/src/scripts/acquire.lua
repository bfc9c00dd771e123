-- Acquire a lock (exclusive, or a read/write lock's writer) and issue its fencing token,
-- in one step.
-- KEYS[1] lock key, KEYS[2] fencing counter of the key's hash slot (shared by every key
-- of the slot, never expires), KEYS[3] the key's writer-intent zset (same slot; may be
-- left out when ARGV[4] is)
-- ARGV[1] owner token (16 bytes), ARGV[2] ttl in milliseconds, ARGV[3] owner metadata
-- ('' or absent: none; see below), ARGV[4] writer id of this wait ('' or absent: no
-- writer intent), ARGV[5] intent in milliseconds (the caller's remaining wait), ARGV[6]
-- the acquire time, the caller's clock in Unix milliseconds ('' or absent: unknown; the
-- server's TIME would cost this script a quarter of its time, for a figure only shown)
-- A grant to a writer id removes that id's intent, whatever the caller believes: an
-- earlier attempt of the same wait may have registered it with its reply lost.
-- The key's value is the token followed by '|1|<ARGV[6]>|<fence>' and ARGV[3] (the
-- format is in info.rs); only its first 16 bytes are ever compared with a token, so a
-- value of a token alone (written before the metadata existed) compares the same.
-- Returns the fencing token when acquired: an integer while a Lua number holds the
-- counter exactly (below 2^53), else the counter read back as its decimal digits (a
-- Lua number's double is inexact above 2^53). A retried call that finds its own token
-- is granted too, its expiry reset to the ttl as a fresh grant would be, and reports the
-- fence its value holds (what inspect shows; other keys of the slot may have moved the
-- counter since), or the counter for a value of a token alone.
-- Returns {pttl, holder} when someone else holds the lock (pttl -1: held without
-- expiry); holder is 16 hex digits of the SHA1 of the holder's value, the same on every
-- node one holder holds (Redlock tells a majority holder from a split vote by it), and
-- nothing anyone could use to release or extend that lock (the digest of the value's
-- first 16 bytes: the token, not the metadata, which differs between nodes). Readers
-- hold it as the marker '~read' padded to 16 bytes with '~' (or '~read' alone, written
-- before the metadata existed), so their holder digest is that of the marker.
-- Held, with a writer id and a positive intent: the id is added to KEYS[3] with score =
-- the server's now (TIME, milliseconds) + ARGV[5], but at most KEYS[1]'s PTTL + 2000
-- (the writer, told that PTTL, asks again by then, or sooner when woken, renewing its
-- intent; one whose writer died runs out soon, not at the end of its wait), expired
-- intents dropped, and KEYS[3] expires with its last intent; new readers are refused while an intent is unexpired
-- (acquire_shared.lua). Every held reply to a call with a writer id means its intent is
-- registered, whoever holds the lock.
-- The counter is incremented first (one call: SET NX GET both tries the key and reads
-- who holds it), and decremented again when someone else holds the key: nobody saw the
-- number in between (one atomic script), and a refusal must not move the counter, or the
-- nodes of a Redlock set would drift apart by every refusal, and a late grant there would
-- carry a fence above its holder's token. A retried call that finds its own token
-- leaves a gap (its value may hold no fence, and then reports the new number), never a
-- repeat; tokens only grow.
-- Fails, the key untouched, when the counter does not yield a positive integer (not an
-- integer or INCR overflowing at 2^63 - 1: nothing written; zero or negative: the INCR
-- stays, as Redis keeps a script's writes up to an error).

local n = redis.pcall('INCR', KEYS[2])
if type(n) == 'table' then
  return redis.error_reply('ERR fencing counter ' .. KEYS[2] .. ': ' .. n.err)
end
local exact = n >= 1 and n < 9007199254740992
local fence
if exact then
  fence = string.format('%d', n)
else
  fence = redis.pcall('GET', KEYS[2])
  if type(fence) ~= 'string' or not string.match(fence, '^[1-9][0-9]*$') then
    if type(fence) == 'table' and fence.err then
      return redis.error_reply('ERR fencing counter ' .. KEYS[2] .. ': ' .. fence.err)
    end
    return redis.error_reply('ERR fencing counter ' .. KEYS[2] .. ' holds no positive integer')
  end
end
local value = ARGV[1] .. '|1|' .. (ARGV[6] or '') .. '|' .. fence .. (ARGV[3] or '')
local held = redis.call('SET', KEYS[1], value, 'NX', 'GET', 'PX', ARGV[2])
local writer = ARGV[4] and ARGV[4] ~= ''
if not held then
  if writer then
    redis.call('ZREM', KEYS[3], ARGV[4])
  end
  if exact then
    return n
  end
  return fence
end
local head = string.sub(held, 1, 16)
if head == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if writer then
    redis.call('ZREM', KEYS[3], ARGV[4])
  end
  local stored = string.match(string.sub(held, 17), '^|1|%d*|([1-9]%d*)')
  if not stored then
    -- A value of a token alone: the counter, above anything issued for it.
    stored = fence
  end
  local m = tonumber(stored)
  if m < 9007199254740992 then
    return m
  end
  return stored
end
redis.call('DECR', KEYS[2])
local holder = string.sub(redis.sha1hex(head), 1, 16)
local pttl = redis.call('PTTL', KEYS[1])
if writer then
  local intent = tonumber(ARGV[5])
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
    redis.call('ZADD', KEYS[3], now + ms, ARGV[4])
    local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
    redis.call('PEXPIRE', KEYS[3], tonumber(last[2]) - now)
  end
end
return {pttl, holder}
