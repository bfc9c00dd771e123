-- Describe a lock for an operator (LockManager::inspect and list), never its token.
-- KEYS[1] lock key K, KEYS[2] its holders zset H (same slot)
-- Returns nil when K is absent or not a string; else {kind, pttl, holder, holders, meta,
-- now}:
--   kind     'e' when K holds a token (exclusive), 'r' / 'p' when it holds the read /
--            permit marker (alone, or padded to 16 bytes with '~': acquire_shared.lua);
--   pttl     K's PTTL in milliseconds (-1: no expiry);
--   holder   16 hex digits of the SHA1 of K's first 16 bytes (the token, or the
--            marker), as acquire.lua names a holder: nothing that releases or extends;
--   holders  1, or for a marker the number of unexpired members of H;
--   meta     K's bytes after the first 16 (the metadata, '|1|<ms>|<fence>|...', see
--            info.rs; '' for a value written before metadata existed);
--   now      the server's clock in milliseconds (TIME), to tell how long it is held.
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
local holders = 1
if kind ~= 'e' then
  holders = redis.call('ZCOUNT', KEYS[2], '(' .. string.format('%d', now), '+inf')
end
local pttl = redis.call('PTTL', KEYS[1])
local holder = string.sub(redis.sha1hex(head), 1, 16)
return {kind, pttl, holder, holders, string.sub(v, 17), string.format('%d', now)}
