-- Withdraw a waiter that stopped waiting without the lock: a writer's intent, or a fair
-- waiter's place (a waiter's id is random: both are removed), and wake whoever it held
-- back.
-- KEYS[1] lock key K (also the wake-up channel), KEYS[2] its writer intents, KEYS[3] its
-- fair queue, KEYS[4] the queue's heartbeats (same slot)
-- ARGV[1] the waiter's id, ARGV[2] publish command (PUBLISH, SPUBLISH, or '' for none)
-- An intent removed wakes every waiter ('': readers it kept out may enter). A place
-- removed that was first while the key is free names the new first waiter ('w:' and its
-- id), who alone asks; any other place held nobody back, and wakes nobody.
-- Returns how many of the two were removed.
local intent = redis.call('ZREM', KEYS[2], ARGV[1])
local first = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
local placed = redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
if ARGV[2] ~= '' then
  if intent == 1 then
    redis.call(ARGV[2], KEYS[1], '')
  elseif placed == 1 and first == ARGV[1] and redis.call('EXISTS', KEYS[1]) == 0 then
    local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    if head then
      redis.call(ARGV[2], KEYS[1], 'w:' .. head)
    end
  end
end
return intent + placed
