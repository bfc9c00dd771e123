-- Renew many shared places (readers, permits) in one call: the watchdog's batch, or one
-- extend.
-- KEYS[2i-1] lock key K_i, KEYS[2i] its holders zset H_i
-- ARGV[3i-2] owner token of place i, ARGV[3i-1] its ttl in milliseconds (a positive
-- integer), ARGV[3i] its marker ('~read' or '~permit'); after the triples, optionally,
-- a publish command (PUBLISH, SPUBLISH, or '' for none)
-- A place is renewed while its token is in H_i unexpired (score > the server's now) and
-- K_i holds the marker (alone, or padded to 16 bytes with '~' and followed by metadata,
-- see acquire_shared.lua): its score becomes now + ttl, and K_i and H_i expire with the
-- latest holder (PTTL = max(score) - now), so shortening one holder never cuts another
-- holder's time. A place kept after its release (hold_at_least) is in H_i under its
-- kept name, not its token (release_shared.lua): not renewed.
-- Publishes 'sooner' on K_i when place i now expires sooner than before (an extend to a
-- shorter ttl): waiters were told the later time, so they ask again.
-- Returns one integer per place: 1 renewed, 0 lost (gone, expired, K_i not holding the
-- marker, or a wrong type). Fails (nothing renewed) when the arguments do not come in
-- triples or a ttl is not a positive integer.
local places = #KEYS / 2
if #KEYS % 2 ~= 0 or (#ARGV ~= 3 * places and #ARGV ~= 3 * places + 1) then
  return redis.error_reply('ERR renew_shared takes key pairs and argument triples')
end
local publish = ARGV[3 * places + 1] or ''
for i = 2, 3 * places, 3 do
  local ttl = tonumber(ARGV[i])
  if not ttl or ttl < 1 or ttl ~= math.floor(ttl) then
    return redis.error_reply('ERR ttl is not a positive integer')
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Whether K_i's value is `marker`'s.
local function marks(v, marker)
  return v == marker or (type(v) == 'string' and string.sub(v, 1, 16) == marker .. string.rep('~', 16 - #marker))
end
local out = {}
for i = 1, places do
  local k, h = KEYS[2 * i - 1], KEYS[2 * i]
  local token, ttl, marker = ARGV[3 * i - 2], tonumber(ARGV[3 * i - 1]), ARGV[3 * i]
  local score = redis.pcall('ZSCORE', h, token)
  out[i] = 0
  if type(score) == 'string' and tonumber(score) > now and marks(redis.pcall('GET', k), marker) then
    redis.call('ZADD', h, now + ttl, token)
    local last = redis.call('ZRANGE', h, -1, -1, 'WITHSCORES')
    local ms = tonumber(last[2]) - now
    redis.call('PEXPIRE', k, ms)
    redis.call('PEXPIRE', h, ms)
    if publish ~= '' and now + ttl < tonumber(score) then
      redis.call(publish, k, 'sooner')
    end
    out[i] = 1
  end
end
return out
