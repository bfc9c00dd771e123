-- Renew many locks in one call (the watchdog's batch).
-- KEYS[i] lock key i
-- ARGV[2i-1] owner token of lock i, ARGV[2i] its ttl in milliseconds
-- Returns one integer per key: 1 renewed, 0 lost (gone, another token, or a wrong type).
local out = {}
for i, key in ipairs(KEYS) do
  if redis.pcall('GET', key) == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', key, ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
