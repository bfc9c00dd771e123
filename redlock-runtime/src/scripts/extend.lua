-- Set the remaining ttl of a lock the caller still owns.
-- KEYS[1] lock key
-- ARGV[1] owner token (16 bytes), ARGV[2] ttl in milliseconds
-- The key holds the token followed by metadata (or the token alone, written before the
-- metadata existed): only its first 16 bytes are compared.
-- Returns 1 when extended, 0 when the key was gone or held by another token.
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, 16) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
