-- Set the remaining ttl of a lock the caller still owns.
-- KEYS[1] lock key
-- ARGV[1] owner token, ARGV[2] ttl in milliseconds
-- Returns 1 when extended, 0 when the key was gone or held by another token.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
