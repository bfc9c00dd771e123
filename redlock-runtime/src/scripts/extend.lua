-- Set the remaining ttl of a lock the caller still owns.
-- KEYS[1] lock key (also the wake-up channel)
-- ARGV[1] owner token (16 bytes), ARGV[2] ttl in milliseconds, ARGV[3] publish command
-- (PUBLISH, SPUBLISH, or '' or absent for none)
-- The key holds the token followed by metadata (or the token alone, written before the
-- metadata existed): only its first 16 bytes are compared. A lock kept after its release
-- (hold_at_least) is held by its kept name, not the token (release.lua): not extended.
-- Publishes 'sooner' when the key now expires sooner than before: waiters were told
-- the later expiry, so they ask again (payloads: release_shared.lua).
-- Returns 1 when extended, 0 when the key was gone or held by another token.
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, 16) == ARGV[1] then
  local before = redis.call('PTTL', KEYS[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if ARGV[3] and ARGV[3] ~= '' and (before < 0 or tonumber(ARGV[2]) < before) then
    redis.call(ARGV[3], KEYS[1], 'sooner')
  end
  return 1
end
return 0
