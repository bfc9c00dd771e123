-- Acquire several exclusive locks at once, all or nothing (lock_all, when every key is
-- on one server: one slot in a cluster), each with a fencing token of its own.
-- KEYS[1..n] lock keys K_1..K_n, KEYS[n+1..2n] the fencing counter F_i of each K_i's
-- slot (keys of one slot name the same counter)
-- ARGV[1] owner token (16 bytes), ARGV[2] ttl in milliseconds (a positive integer),
-- ARGV[3] owner metadata ('' or absent: none), ARGV[4] the acquire time, the caller's
-- clock in Unix milliseconds ('' or absent: unknown), as in acquire.lua
-- Each K_i's value is the token followed by '|1|<ARGV[4]>|<fence_i>' and ARGV[3], as
-- in acquire.lua; only the first 16 bytes are compared with a token.
-- Returns {1, fence_1, ..., fence_n} when all are acquired: each fence an INCR of F_i,
-- in key order, so keys sharing a counter get distinct increasing fences; an integer
-- below 2^53, else the counter read back as its decimal digits right after that INCR. A
-- K_i already holding this token (a retried call) is taken again: its expiry reset to
-- the ttl, a fresh fence issued.
-- Returns {0, i, pttl, holder} when K_i (the first such i) is held by another value
-- (pttl and holder as in acquire.lua; a read/permit marker counts as another holder);
-- nothing is written then.
-- Fails (error reply, every K_i this call took given back) when the arguments are
-- malformed, a counter does not yield a positive integer, or a K_i is of another type.
-- As acquire.lua, each key costs an INCR and one SET NX GET (which both tries the key
-- and reads who holds it), not a GET first: a refusal at K_i takes back what the keys
-- before it took (the K_j this call wrote are deleted, every F_j decremented), within
-- the one atomic script, so nobody saw them and no counter moved.
local n = #KEYS / 2
if n < 1 or n ~= math.floor(n) then
  return redis.error_reply('ERR acquire_all takes lock keys then as many counters')
end
if not string.match(ARGV[2] or '', '^[1-9][0-9]*$') then
  return redis.error_reply('ERR ttl is not a positive integer')
end
local stamp = ARGV[1] .. '|1|' .. (ARGV[4] or '') .. '|'
local owner = ARGV[3] or ''
local out = {1}
-- written[j]: K_j was free and this call wrote it; again[j]: K_j held this token
-- already (a retry) and gets its new value once every key is known to be free.
local written, again = {}, {}
-- Takes back what keys 1..upto took: the K_j written, and counters 1..counted.
local function undo(upto, counted)
  for j = 1, upto do
    if written[j] then
      redis.call('DEL', KEYS[j])
    end
  end
  for j = counted, 1, -1 do
    redis.call('DECR', KEYS[n + j])
  end
end
local function counter_error(i, counted, msg)
  undo(i - 1, counted)
  return redis.error_reply('ERR fencing counter ' .. KEYS[n + i] .. msg)
end
for i = 1, n do
  local f = KEYS[n + i]
  local fence = redis.pcall('INCR', f)
  if type(fence) == 'table' then
    return counter_error(i, i - 1, ': ' .. fence.err)
  end
  local digits
  if fence < 1 or fence >= 9007199254740992 then
    fence = redis.pcall('GET', f)
    if type(fence) ~= 'string' or not string.match(fence, '^[1-9][0-9]*$') then
      return counter_error(i, i, ' holds no positive integer')
    end
    digits = fence
  else
    digits = string.format('%d', fence)
  end
  local value = stamp .. digits .. owner
  local held = redis.pcall('SET', KEYS[i], value, 'NX', 'GET', 'PX', ARGV[2])
  if type(held) == 'table' then
    undo(i - 1, i)
    return held
  end
  if not held then
    written[i] = true
  else
    local head = string.sub(held, 1, 16)
    if head ~= ARGV[1] then
      undo(i - 1, i)
      return {0, i, redis.call('PTTL', KEYS[i]), string.sub(redis.sha1hex(head), 1, 16)}
    end
    again[i] = value
  end
  out[i + 1] = fence
end
for i, value in pairs(again) do
  redis.call('SET', KEYS[i], value, 'PX', ARGV[2])
end
return out
