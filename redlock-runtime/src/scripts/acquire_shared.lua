-- Acquire a shared place in a lock: a read lock's reader, or one of a lock's permits.
-- KEYS[1] lock key K, KEYS[2] its holders zset H, KEYS[3] fencing counter of the key's
-- hash slot (never expires), KEYS[4] its writer-intent zset W (all in one slot)
-- ARGV[1] owner token, ARGV[2] ttl in milliseconds (a positive integer), ARGV[3] marker
-- ('~read' or '~permit'), ARGV[4] limit (0 = unlimited, as for readers), ARGV[5] '1' to
-- refuse while a writer intent is unexpired (readers), ARGV[6] owner metadata ('' or
-- absent: none)
-- While shared holders exist, K holds the marker padded to 16 bytes with '~' followed by
-- '|1|<server ms>|<fence>' and ARGV[6] of the latest grant (the format is in info.rs;
-- the marker alone when written before the metadata existed: such a K is left as it is,
-- for the holders that wrote it), so the exclusive acquire finds it held; H maps
-- each holder's token to its expiry in the server's milliseconds (TIME, never the
-- client's clock), and K and H both expire with the last holder: PTTL = max(score) - now.
-- Only unexpired holders (score > now) are counted; expired ones are left for the next
-- release to reclaim (release_shared.lua), and K's expiry is the latest score. K and H
-- were set to expire together (PEXPIRE … GT keeps the later of theirs and the new
-- holder's), so when K is absent H holds no live holder either.
-- Returns the fencing token when granted (INCR of KEYS[3]): an integer below 2^53, else
-- the counter read back as its decimal digits. A retried call that finds its own token
-- unexpired is granted again (expiry reset to now + ttl, no intent or limit check: it
-- already holds its place) with a fresh token: other shared holders may have been
-- granted since its first call, so reading the counter back could hand it one of their
-- tokens.
-- Returns {ms, holder} when refused, holder being 16 hex digits of a SHA1, the same on
-- every node for the same situation:
--   K holds anything but the marker: {PTTL of K, digest of K's value} as acquire.lua;
--   a writer intent is unexpired (ARGV[5] = '1'): {ms until the earliest intent expires,
--   or K's PTTL when that is sooner, digest of '~write-intent'};
--   limit > 0 and at least limit live holders: {ms until the earliest holder expires,
--   digest of the marker}.
-- Fails (error reply, nothing granted) when the ttl or limit is not a number, when a key
-- has the wrong type, or when the counter does not yield a positive integer.
local function digest(s)
  return string.sub(redis.sha1hex(string.sub(s, 1, 16)), 1, 16)
end
local ttl, limit = tonumber(ARGV[2]), tonumber(ARGV[4])
if not ttl or ttl < 1 or ttl ~= math.floor(ttl) then
  return redis.error_reply('ERR ttl is not a positive integer')
end
if not limit then
  return redis.error_reply('ERR limit is not a number')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local marker = ARGV[3]
local padded = marker .. string.rep('~', 16 - #marker)
local held = redis.call('GET', KEYS[1])
if held and held ~= marker and string.sub(held, 1, 16) ~= padded then
  return {redis.call('PTTL', KEYS[1]), digest(held)}
end
local live = '(' .. string.format('%d', now)
-- Whether this token already holds an unexpired place (a retried call): asked only when
-- a check would refuse, which a holder is exempt from.
local function holds()
  local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
  return score and tonumber(score) > now
end
if ARGV[5] == '1' then
  local first = redis.call('ZRANGE', KEYS[4], live, '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
  if first[1] and not holds() then
    local wait = tonumber(first[2]) - now
    local pttl = redis.call('PTTL', KEYS[1])
    if pttl > 0 and pttl < wait then
      wait = pttl
    end
    return {wait, string.sub(redis.sha1hex('~write-intent'), 1, 16)}
  end
end
if limit > 0 and redis.call('ZCOUNT', KEYS[2], live, '+inf') >= limit and not holds() then
  local first = redis.call('ZRANGE', KEYS[2], live, '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
  return {tonumber(first[2]) - now, digest(padded)}
end
local n = redis.pcall('INCR', KEYS[3])
if type(n) == 'table' then
  return redis.error_reply('ERR fencing counter ' .. KEYS[3] .. ': ' .. n.err)
end
local fence = n
if n < 1 or n >= 9007199254740992 then
  fence = redis.pcall('GET', KEYS[3])
  if type(fence) == 'table' and fence.err then
    return redis.error_reply('ERR fencing counter ' .. KEYS[3] .. ': ' .. fence.err)
  end
  if type(fence) ~= 'string' or not string.match(fence, '^[1-9][0-9]*$') then
    return redis.error_reply('ERR fencing counter ' .. KEYS[3] .. ' holds no positive integer')
  end
else
  fence = string.format('%d', n)
end
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
local value = padded .. '|1|' .. string.format('%d', now) .. '|' .. fence .. (ARGV[6] or '')
if not held then
  redis.call('SET', KEYS[1], value, 'PX', ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
else
  -- K and H expire with the latest holder: now + ttl unless someone's place ends later.
  if held ~= marker then
    redis.call('SET', KEYS[1], value, 'KEEPTTL')
  end
  redis.call('PEXPIRE', KEYS[1], ttl, 'GT')
  redis.call('PEXPIRE', KEYS[2], ttl, 'GT')
end
if n >= 1 and n < 9007199254740992 then
  return n
end
return fence
