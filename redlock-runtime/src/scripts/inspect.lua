-- Describe a lock for an operator (LockManager::inspect and list), never its token.
-- KEYS[1] lock key K, KEYS[2] its holders zset H, KEYS[3] its fair queue's heartbeats
-- (same slot; acquire_fair.lua)
-- Returns nil when K is absent or not a string; else {kind, pttl, holder, holders, meta,
-- now, kept, shared, queued}:
--   kind     'e' when K holds a token (exclusive), 'r' / 'p' when it holds the read /
--            permit marker (alone, or padded to 16 bytes with '~': acquire_shared.lua);
--   pttl     K's PTTL in milliseconds (-1: no expiry);
--   holder   16 hex digits of the SHA1 of K's first 16 bytes (the token, or the
--            marker), as acquire.lua names a holder: nothing that releases or extends;
--   holders  1, or for a marker the number of unexpired members of H;
--   meta     K's bytes after the first 16 (the metadata, '|1|<ms>|<fence>|...', see
--            info.rs; '' for a value written before metadata existed);
--   now      the server's clock in milliseconds (TIME), to tell how long it is held;
--   kept     how many of the holders were released with hold_at_least and are only kept
--            until their minimum hold: held under a kept name, 16 hex digits (release.lua,
--            release_shared.lua), where a holder's token is 16 random bytes;
--   shared   for a marker, {name, ms left} of each live holder, soonest to expire first:
--            the name a holder would be kept under (so it keeps its name when kept),
--            followed by '~kept' when it is kept; {} for an exclusive lock.
--   queued   how many waiters hold a live place in the key's fair queue (0 for a key
--            that is not fair).
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' then
  return nil
end
local head = string.sub(v, 1, 16)
local kind = 'e'
if v == '~read' or head == '~read~~~~~~~~~~~' then
  kind = 'r'
elseif v == '~permit' or head == '~permit~~~~~~~~~' then
  kind = 'p'
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function is_kept(name)
  return #name == 16 and string.match(name, '^%x+$') ~= nil
end
local holders = 1
local kept = 0
local shared = {}
if kind == 'e' then
  if is_kept(head) then
    kept = 1
  end
else
  local live = redis.call('ZRANGE', KEYS[2], '(' .. string.format('%d', now), '+inf', 'BYSCORE', 'WITHSCORES')
  holders = #live / 2
  for i = 1, #live, 2 do
    local name = live[i]
    local left = math.floor(tonumber(live[i + 1]) - now)
    if is_kept(name) then
      kept = kept + 1
      shared[#shared + 1] = {name .. '~kept', left}
    else
      shared[#shared + 1] = {string.sub(redis.sha1hex('~kept' .. name), 1, 16), left}
    end
  end
end
local pttl = redis.call('PTTL', KEYS[1])
local holder = string.sub(redis.sha1hex(head), 1, 16)
local queued = 0
if KEYS[3] then
  queued = redis.call('ZCOUNT', KEYS[3], '(' .. string.format('%d', now), '+inf')
end
return {kind, pttl, holder, holders, string.sub(v, 17), string.format('%d', now), kept, shared, queued}
