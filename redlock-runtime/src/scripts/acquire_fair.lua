-- A fair lock's gate: the caller's place in the key's queue, and whether it is its turn.
-- This file runs first and acquire.lua after it, as one script (scripts.rs joins them):
-- when it is the caller's turn, the gate falls through to acquire.lua's grant, fence
-- and retry rules unchanged.
-- KEYS[1..3] as acquire.lua, KEYS[4] the queue Q (member: a waiter's id, score: its
-- ticket, the order of arrival), KEYS[5] the heartbeats H (member: a waiter's id, score:
-- the server time in milliseconds its place runs out at)
-- ARGV[1..6] as acquire.lua (ARGV[4] and ARGV[5] empty: a fair waiter is no writer
-- intent), ARGV[7] the waiter's id ('': an attempt that does not queue, its turn only
-- when nobody is queued), ARGV[8] its ticket ('0': the next one here, after the last
-- queued; else the ticket it had, so a place dropped here, or never made here (a Redlock
-- node that missed it), comes back where it was; a greater one than its place has here
-- moves it there), ARGV[9] how long its place lasts without another attempt
-- (milliseconds), ARGV[10] the most places Q holds, ARGV[11] the publish command
-- (PUBLISH, SPUBLISH, or '' for none), ARGV[12] 'place' to make or move the place only,
-- never granting (a Redlock waiter settling its ticket on every node), else ''
-- Places whose heartbeat ran out by the server's clock are dropped first, so nobody waits
-- behind a waiter that died, was cut off or stopped waiting without a word. When that
-- leaves a new first place while the key is free, its waiter is told ('w:' and its id
-- published on the key's channel): the waiter a release names and nobody else asks.
-- It is the caller's turn when the key holds its own token (a retry whose reply was
-- lost: granted again wherever its place now is, or whether it has one), or when its
-- place is the first (or, with no id, nobody is queued) and the key is free: its place,
-- if any, is removed and acquire.lua grants. Otherwise returns {pttl, holder, ticket}: the key's
-- PTTL (-2: free, someone else's turn) and holder (as acquire.lua names one; '' when
-- free), and the caller's ticket (0 without an id).
-- A queue at its bound refuses a new place: an error reply starting 'QUEUEFULL'.
local waiter, asked, beat = ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9])
if waiter ~= '' and (not asked or not beat or beat < 1) then
  return redis.error_reply('ERR fair queue: ticket and heartbeat must be numbers')
end
-- Nobody queued (no queue key: every place gone) and the key free: the caller's turn, and
-- the gate's work (a place made, found first, then removed) would leave nothing behind,
-- so it is skipped (one call instead of about fifteen). A settling round ('place') always
-- goes through.
if ARGV[12] == 'place' or redis.call('EXISTS', KEYS[4], KEYS[1]) > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local first = redis.call('ZRANGE', KEYS[4], 0, 0)[1]
  local gone = redis.call('ZRANGE', KEYS[5], '-inf', now, 'BYSCORE')
  for i = 1, #gone, 1000 do
    local part = {unpack(gone, i, math.min(i + 999, #gone))}
    redis.call('ZREM', KEYS[4], unpack(part))
    redis.call('ZREM', KEYS[5], unpack(part))
  end
  local ticket = 0
  if waiter ~= '' then
    local score = redis.call('ZSCORE', KEYS[4], waiter)
    if score then
      ticket = tonumber(score)
      if asked > ticket then
        ticket = asked
        redis.call('ZADD', KEYS[4], ticket, waiter)
      end
    else
      if redis.call('ZCOUNT', KEYS[4], '-inf', '+inf') >= tonumber(ARGV[10]) then
        return redis.error_reply('QUEUEFULL the fair queue of ' .. KEYS[1] .. ' is full')
      end
      ticket = asked
      if ticket < 1 then
        local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
        ticket = (tonumber(last[2]) or 0) + 1
      end
      redis.call('ZADD', KEYS[4], ticket, waiter)
    end
    redis.call('ZADD', KEYS[5], now + beat, waiter)
    local latest = redis.call('ZRANGE', KEYS[5], -1, -1, 'WITHSCORES')
    local lasts = tonumber(latest[2]) - now
    redis.call('PEXPIRE', KEYS[4], lasts)
    redis.call('PEXPIRE', KEYS[5], lasts)
  end
  local head = redis.call('ZRANGE', KEYS[4], 0, 0)[1]
  local v = redis.call('GET', KEYS[1])
  local turn
  if v then
    turn = string.sub(v, 1, 16) == ARGV[1]
  elseif waiter == '' then
    turn = head == nil
  else
    turn = head == waiter
  end
  if ARGV[12] == 'place' then
    turn = false
  end
  if not turn then
    if not v and head and head ~= first and head ~= waiter and ARGV[11] ~= '' then
      redis.call(ARGV[11], KEYS[1], 'w:' .. head)
    end
    if not v then
      return {-2, '', ticket}
    end
    local holder = string.sub(redis.sha1hex(string.sub(v, 1, 16)), 1, 16)
    return {redis.call('PTTL', KEYS[1]), holder, ticket}
  end
  if waiter ~= '' then
    redis.call('ZREM', KEYS[4], waiter)
    redis.call('ZREM', KEYS[5], waiter)
  end
end
