-- Release several exclusive locks for several callers in one call: the plain releases
-- (nothing kept, no replicas to wait for) that one connection's callers made while
-- other calls were in flight (backend/coalesce.rs). Each key is released exactly as
-- release.lua releases it with nothing to keep.
-- KEYS[i] lock key i
-- ARGV[1] publish command (PUBLISH, or '' for none), ARGV[i + 1] key i's owner token
-- Returns one reply per key, in order: 1 released (and a wake-up published on the key's
-- name), 0 the key was gone, -1 someone else holds it, or {message} when the release
-- failed (a key that holds no string: what release.lua fails with), the other keys
-- released all the same.

local function release(key, token)
  local held = redis.call('GET', key)
  if not held then
    return 0
  end
  local head = string.sub(held, 1, 16)
  if head ~= token and head ~= string.sub(redis.sha1hex('~kept' .. token), 1, 16) then
    return -1
  end
  redis.call('DEL', key)
  if ARGV[1] ~= '' then
    redis.call(ARGV[1], key, '')
  end
  return 1
end

local replies = {}
for i, key in ipairs(KEYS) do
  local ok, reply = pcall(release, key, ARGV[i + 1])
  if not ok then
    reply = {type(reply) == 'table' and reply.err or tostring(reply)}
  end
  replies[i] = reply
end
return replies
