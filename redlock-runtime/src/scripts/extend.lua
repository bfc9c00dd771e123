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
-- (PEXPIRE's GT option is Redis 7.0's, as the sharded pub/sub the cluster uses.)
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, 16) == ARGV[1] then
  -- Later than the key's expiry (the usual extend): one call, and nobody to tell.
  if redis.call('PEXPIRE', KEYS[1], ARGV[2], 'GT') == 1 then
    return 1
  end
  -- No later (or the key has no expiry, which GT counts as infinite).
  local before = redis.call('PTTL', KEYS[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if ARGV[3] and ARGV[3] ~= '' and (before < 0 or tonumber(ARGV[2]) < before) then
    redis.call(ARGV[3], KEYS[1], 'sooner')
  end
  return 1
end
return 0
