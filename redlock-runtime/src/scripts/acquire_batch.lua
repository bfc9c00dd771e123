-- Acquire several exclusive locks for several callers in one call: the plain claims
-- (no writer intent) that one connection's callers made while other calls were in
-- flight (backend/coalesce.rs). Each claim is decided on its own, exactly as
-- acquire.lua decides a claim without a writer id; one claim's refusal or failure
-- does not touch another's.
-- KEYS[2i-1] claim i's lock key, KEYS[2i] the fencing counter of its hash slot
-- ARGV[1] owner metadata ('' for none), ARGV[2] the acquire time (the caller's clock in
-- Unix milliseconds), ARGV[2i+1] claim i's owner token (16 bytes), ARGV[2i+2] its ttl in
-- milliseconds
-- Returns one reply per claim, in order, each what acquire.lua returns: the fencing
-- token (an integer below 2^53, else its decimal digits), {pttl, holder} when someone
-- else holds the key, or {message} when the claim fails (what acquire.lua fails with:
-- a counter that yields no positive integer, a key that holds no string; an error reply
-- nested in the array would fail the whole call in the client, every claim with it).
-- A failing claim keeps what it wrote before failing, as acquire.lua does, and the
-- claims after it are decided all the same.

local function claim(key, counter, token, ttl)
  local n = redis.pcall('INCR', counter)
  if type(n) == 'table' then
    return {'ERR fencing counter ' .. counter .. ': ' .. n.err}
  end
  local exact = n >= 1 and n < 9007199254740992
  local fence
  if exact then
    fence = string.format('%d', n)
  else
    fence = redis.pcall('GET', counter)
    if type(fence) ~= 'string' or not string.match(fence, '^[1-9][0-9]*$') then
      if type(fence) == 'table' and fence.err then
        return {'ERR fencing counter ' .. counter .. ': ' .. fence.err}
      end
      return {'ERR fencing counter ' .. counter .. ' holds no positive integer'}
    end
  end
  local value = token .. '|1|' .. ARGV[2] .. '|' .. fence .. ARGV[1]
  local held = redis.call('SET', key, value, 'NX', 'GET', 'PX', ttl)
  if not held then
    if exact then
      return n
    end
    return fence
  end
  local head = string.sub(held, 1, 16)
  if head == token then
    -- A retried call finding its own token (a batch sent again after a dropped
    -- connection): granted again, as in acquire.lua.
    redis.call('PEXPIRE', key, ttl)
    local stored = string.match(string.sub(held, 17), '^|1|%d*|([1-9]%d*)') or fence
    local m = tonumber(stored)
    if m < 9007199254740992 then
      return m
    end
    return stored
  end
  redis.call('DECR', counter)
  return {redis.call('PTTL', key), string.sub(redis.sha1hex(head), 1, 16)}
end

local replies = {}
for i = 1, #KEYS / 2 do
  local ok, reply = pcall(claim, KEYS[2 * i - 1], KEYS[2 * i], ARGV[2 * i + 1], ARGV[2 * i + 2])
  if not ok then
    reply = {type(reply) == 'table' and reply.err or tostring(reply)}
  end
  replies[i] = reply
end
return replies
