-- Renew many locks in one call (the watchdog's batch).
-- KEYS[i] lock key i
-- ARGV[2i-1] owner token of lock i (16 bytes: only the value's first 16 bytes are
-- compared, see extend.lua), ARGV[2i] its ttl in milliseconds
-- Returns one integer per key: 1 renewed, 0 lost (gone, another token, or a wrong type).
local out = {}
for i, key in ipairs(KEYS) do
  local held = redis.pcall('GET', key)
  if type(held) == 'string' and string.sub(held, 1, 16) == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', key, ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
