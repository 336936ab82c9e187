"""The Lua that makes a limit shared: each script one atomic step on Redis's clock.

Every script reads ``TIME`` on the server, so the processes sharing a limit
never compare their own clocks; they receive *durations* (how long to wait)
and sleep them on trio's clock. Numbers cross the boundary as strings written
with ``%.17g``: Lua would otherwise print a double with 14 digits, which at
today's epoch rounds server time to 100 µs.

This module also holds the one boundary where a Redis failure becomes
``LimiterUnavailableError``: ``bounded``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, TypeVar

import trio
from coredis.exceptions import RedisError

from ._bucket import SURPLUS
from ._exceptions import LimiterUnavailableError
from ._learning import TOGETHER

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = [
    "ACQUIRE_LEASE",
    "BUCKET",
    "CLAIM",
    "FOREVER",
    "RELEASE_CLAIM",
    "RENEW_CLAIM",
    "RENEW_LEASES",
    "STARTS",
    "STARTS_KEPT",
    "WINDOW",
    "bounded",
    "lua_number",
]

T = TypeVar("T")

FOREVER = 1e12  # "no limit on the wait", as a number Lua's tonumber can read
STARTS_KEPT = 60  # seconds a shared bucket logs each start (as a scope remembers its own)

_PRELUDE = """
local function num(x) return string.format('%.17g', x) end
-- Keep ``key`` ``seconds`` more, and a second: at most FOREVER (1e12 s), in whole ms
-- written as an integer (a rate of 1e-15 made the wait 1e18 ms, which '%.17g' writes
-- as '1e+18', and PEXPIRE refused it: every call was refused as if Redis were down).
local function expire(key, seconds)
  local ms = math.min(math.ceil(seconds * 1000) + 1000, 1e15)
  redis.call('PEXPIRE', key, string.format('%d', ms))
end
-- A number read from the shared state, or ``default`` where it holds none: another
-- writer (or anyone with the key) may have left 'nan' or '-inf', which tonumber reads,
-- and which made every comparison after it pass: the limiter let every call go.
local function finite(x, default)
  x = tonumber(x)
  if x == nil or x ~= x or x == math.huge or x == -math.huge then return default end
  return x
end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
"""

# What every op of a token script (the bucket, the window) reads first: the
# op, the call's cost, and the op's own number (a wait bound, a block, a count).
_TOKEN_OP = (
    _PRELUDE
    + """
local op = ARGV[1]
local cost, extra = tonumber(ARGV[4]), tonumber(ARGV[5])
"""
)

# The token bucket of ``_bucket.py`` (GCRA), kept in a hash {full, blocked,
# epoch}: ``full`` is when the bucket would be full again given every start
# booked, so a booking takes its tokens at its start, and bookings made
# during a block are owed from the tokens that accrue during it. ``epoch``
# changes whenever the server says otherwise (drain, block, sync): bookings
# of an older epoch are void and their holders book again. A fresh hash
# (first use, expiry, or a Redis restart) starts a new epoch from the clock.
# ARGV: op, rate, burst, cost, extra, epoch, before, after, slack, process,
# ahead (those two for ``reserve`` and ``adopt``), entry (a start's name in the log),
# lost (how long the bucket would take to fill, should Redis have lost it). Ops:
#   reserve  book ARGV[4] tokens; refuse, writing nothing, if the wait exceeds ARGV[5]
#   peek     the wait for ARGV[4] tokens, consuming nothing
#   refund   undo the latest booking (epoch ARGV[6], full ARGV[7] -> ARGV[8])
#   drain    a 429: no tokens now, block for ARGV[5] seconds, new epoch
#   block    start nothing for ARGV[5] seconds from now, new epoch; the tokens
#            of the bookings it voids come back
#   rescale  the rate went up from ARGV[5] to ARGV[2]: what is booked ahead is
#            booked at the new rate (the tokens held now stay as they are), so
#            the schedule contracts towards now by ``laid`` (the rate it was laid
#            at; ARGV[5] where unknown) / ARGV[2], as every op at a new rate does;
#            ARGV[10]'s logged starts ahead move by ARGV[5] / ARGV[2], as its
#            holders re-time theirs
#   sync     the server holds about ARGV[5] tokens now and at most ARGV[7]: adopt
#            ARGV[5], new epoch, if the bucket holds more than ARGV[7]
#   adopt    the server held at least ARGV[5] tokens, by the counts of the process
#            ARGV[10], which has ARGV[11] tokens booked ahead; the others' starts
#            logged in the last ARGV[7] s it may not have counted: adopt ARGV[5]
#            less those, new epoch, if that is a token (``SURPLUS``) or more above
#            the bucket with every booking ahead given back (all are void)
#   widen    a process measured a slack of ARGV[5], wider than the burst under way
#            was booked with: a busy bucket's whole schedule moves that much
#            later. ``full`` moves, and ``shift`` (the total moved) tells each
#            booking ahead how much later it starts (its holder compares it
#            with the shift it was booked at). ``slack`` keeps the widest
#            applied, so processes that each measure it add it once, not once each;
#            a burst opens with the widest, whoever books first.
#   prove    a process proved by its counts that the server refills ARGV[5] tokens a
#            second at least: kept if faster than any proved before (``proven``)
#   owe      the server lost ARGV[5] tokens (a request that took a full bucket left
#            late): a busy bucket's whole schedule moves ARGV[5] / rate later, as
#            ``widen`` moves it; a full one holds that much less
# A missing hash is a full, unblocked bucket, so the key expires once it
# would refill and unblock: idle scopes leave nothing behind.
# Every booking's start is also logged in the sorted set KEYS[3] (member
# "<process> <sequence from KEYS[4]> <cost>", scored by its start) for
# ``STARTS_KEPT`` s, so that a process learning the rate counts what the others
# started (``STARTS``): a refund takes its entry out (ARGV[12]), a new epoch
# takes out every start not yet due, as it voids their bookings, and a start
# not yet due moves as its holder re-times it (rescale, widen, owe).
# Reply: {granted, wait, tokens, blocked_for, exhausted_pttl, epoch, before,
# after, shift, opened, opened - now, entry, proven} (KEYS[2] is the shared "quota
# exhausted" marker, PTTL -2 when absent; ``opened`` is when the latest burst's
# first booking starts, 0 before any; ``entry``, a booking's name in the log;
# ``proven``, the fastest refill proved, 0 before any).
BUCKET = (
    _TOKEN_OP
    + """
local rate, burst, slack = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[9])
local state = redis.call('HMGET', KEYS[1], 'full', 'blocked', 'epoch', 'slack', 'shift',
                         'opened', 'laid', 'proven')
local full = finite(state[1], 0)
-- A bucket Redis lost (a restart, a flush) while a process was using it is made again
-- no fuller than that process saw it (ARGV[13]: seconds until full by its view; a
-- bucket that expired was full, and its view says so). Made full, it let a fresh burst
-- through while the server's bucket was spent: two to four 429s a restart.
local lost = finite(ARGV[13], 0)
if state[1] == false and rate > 0 and lost > 0 then full = now + math.min(lost, burst / rate) end
local blocked = finite(state[2], 0)
local epoch = finite(state[3], math.floor(now * 1000000))
local applied = finite(state[4], 0)
local shift = finite(state[5], 0)
local opened = finite(state[6], 0)
local laid = finite(state[7], 0)  -- the rate ``full`` was laid at: its last writer's
local proven = finite(state[8], 0)  -- the fastest refill any process proved (``prove``)
-- Rates only: read as one, a "1e999" another writer left stretched the schedule forever.
if not (laid > 0 and laid < math.huge) then laid = 0 end
if not (proven > 0 and proven < math.huge) then proven = 0 end
local me = ARGV[10] or ''
-- What is booked ahead is the same tokens at any rate: a caller at another rate than
-- the one ``full`` was laid at reads them at its own, and refills them at its own from
-- now on. Read as time instead, a process that slowed down (a 429) counted fewer
-- tokens booked than were, and booked sooner than the others: eleven at once after a
-- block against a burst of 10. A rate that went up (``rescale``) contracts the schedule
-- so, once however many processes make the same rise.
-- Booked time past a block is tokens; the block itself is not (read as tokens, a process
-- at 12/s after one at 180/s booked at +1 s after a 1 s block waited until +15 s).
if op == 'rescale' and laid <= 0 then laid = extra end  -- an older hash: the caller's
if rate > 0 then
  local base = math.max(now, blocked)
  if laid > 0 and laid ~= rate and full > base then full = base + (full - base) * laid / rate end
  laid = rate
end
local function tokens_now()
  if rate <= 0 then return burst end
  return burst - math.max(0, full - now) * rate
end
local function slot(c)
  local start = math.max(now, blocked)
  if rate > 0 then start = math.max(start, full - (burst - c) / rate) end
  return start
end
-- Each logged start not yet due moves as its holder re-times its booking (``confirm``):
-- left where it was booked, the others counted it when it had not started (or after),
-- and a void took out a request that had started.
local function move_starts(mine_only, moved)
  local ahead = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. num(now), '+inf', 'WITHSCORES')
  for i = 1, #ahead, 2 do
    if not mine_only or string.sub(ahead[i], 1, #me + 1) == me .. ' ' then
      redis.call('ZADD', KEYS[3], 'XX', num(moved(tonumber(ahead[i + 1]))), ahead[i])
    end
  end
end
local granted, wait, write = 0, 0, true
local before = full
local entry = ''
local void = false  -- a new epoch: the bookings not yet due are void, and so are their starts
if op == 'reserve' then
  local start = slot(cost)
  wait = start - now
  if wait <= extra then
    granted = 1
    if rate > 0 then
      local was_full = full <= start
      full = math.max(full, start) + cost / rate
      if was_full then
        applied = math.max(slack, applied)  -- the widest any process measured
        full, opened = full + applied, start
      end
    end
    entry = me .. ' ' .. redis.call('INCR', KEYS[4]) .. ' ' .. num(cost)
    redis.call('ZADD', KEYS[3], start, entry)
  else
    write = false
  end
elseif op == 'peek' then
  wait, write = slot(cost) - now, false
elseif op == 'refund' then
  redis.call('ZREM', KEYS[3], ARGV[12] or '')
  if tonumber(ARGV[6]) == epoch and rate > 0 and tonumber(ARGV[8]) == full then
    full = tonumber(ARGV[7])
  else
    write = false
  end
elseif op == 'drain' then
  epoch, void = epoch + 1, true
  if rate > 0 then full = now + burst / rate end
  blocked = math.max(blocked, now + extra)
elseif op == 'block' then
  if now + extra > blocked then
    epoch, blocked, void = epoch + 1, now + extra, true
    if rate > 0 then
      -- The bookings not yet due are void: their tokens come back, to be booked
      -- again after the block (as the local bucket's block gives them back).
      local ahead = 0
      for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. num(now), '+inf')) do
        ahead = ahead + finite(string.match(member, '(%S+)$'), 0)
      end
      full = math.max(now, full - ahead / rate)
    end
  else
    write = false
  end
elseif op == 'widen' then
  if rate > 0 and full > now and extra > applied then
    local move = extra - applied
    move_starts(false, function(start) return start + move end)
    full, shift, applied = full + move, shift + move, extra
  else
    write = false
  end
elseif op == 'owe' then
  if rate > 0 and extra > 0 then
    local move = extra / rate
    if full > now then
      move_starts(false, function(start) return start + move end)
      full, shift = full + move, shift + move
    else
      full = now + move
    end
  else
    write = false
  end
elseif op == 'rescale' then
  if rate > 0 and extra > 0 and full > now then
    -- This process's holders re-time theirs by its old rate (``_go_faster``), and their
    -- logged starts move with them; the others' keep theirs.
    -- (The schedule contracted as this op began.)
    move_starts(true, function(start) return now + (start - now) * extra / rate end)
  else
    write = false
  end
elseif op == 'adopt' then
  -- What the others started since the request was sent, the server may not have
  -- counted: taken off. What they booked ahead is void, as this process's is, and
  -- comes back to the bucket to be booked again.
  local started, ahead = 0, tonumber(ARGV[11])
  local logged = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. num(now - tonumber(ARGV[7])),
                            '+inf', 'WITHSCORES')
  for i = 1, #logged, 2 do
    if string.sub(logged[i], 1, #me + 1) ~= me .. ' ' then
      local c = finite(string.match(logged[i], '(%S+)$'), 0)
      if tonumber(logged[i + 1]) <= now then started = started + c else ahead = ahead + c end
    end
  end
  local least = extra - started
  if rate > 0 and least >= tokens_now() + ahead + SURPLUS then
    epoch, full, void = epoch + 1, now + (burst - math.min(least, burst)) / rate, true
  else
    write = false
  end
elseif op == 'prove' then
  if extra > proven then proven = extra else write = false end
elseif op == 'sync' then
  if rate > 0 and tonumber(ARGV[7]) < tokens_now() - 1e-9 then
    epoch, full, void = epoch + 1, now + (burst - extra) / rate, true
  else
    write = false
  end
else
  return redis.error_reply('unknown bucket op ' .. op)
end
if write then
  redis.call('HSET', KEYS[1], 'full', num(full), 'blocked', num(blocked),
             'epoch', string.format('%d', epoch), 'slack', num(applied), 'shift', num(shift),
             'opened', num(opened), 'laid', num(laid), 'proven', num(proven))
  local idle = math.max(0, blocked - now, full - now)
  expire(KEYS[1], idle)
end
if void then redis.call('ZREMRANGEBYSCORE', KEYS[3], '(' .. num(now), '+inf') end
if entry ~= '' then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. num(now - STARTS_KEPT))
  redis.call('PEXPIRE', KEYS[3], STARTS_KEPT * 1000 + 1000)
  redis.call('PEXPIRE', KEYS[4], STARTS_KEPT * 1000 + 1000)
end
return {granted, num(wait), num(tokens_now()), num(math.max(0, blocked - now)),
        redis.call('PTTL', KEYS[2]), string.format('%d', epoch), num(before), num(full),
        num(shift), num(opened), num(opened - now), entry, num(proven)}
""".replace("STARTS_KEPT", str(STARTS_KEPT)).replace("SURPLUS", repr(SURPLUS))
)

# The starts logged in KEYS[1] by ``BUCKET`` after ARGV[1] (server time), at most
# ARGV[2] of them: {now, member, score, member, score, ...}.
STARTS = (
    _PRELUDE
    + """
local found = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], num(now), 'WITHSCORES',
                         'LIMIT', 0, tonumber(ARGV[2]))
table.insert(found, 1, num(now))
return found
"""
)

# The sliding log of ``_window.py``: a sorted set KEYS[1] of bookings scored by
# their start (server time), each holding its cost for ``window + slack`` s
# from it (or until it is held, if later), and a hash KEYS[2] {blocked,
# epoch, longest}. A member is "<cost>|<id>" for a booking; "!<cost>|<id>" for
# one its holder confirmed (its request went: a booking due at once is
# confirmed as it is made); "=<cost>|<held>|<id>" for one whose answer showed
# when it reached the server (held until ``held``); "~<cost>|<id>" for a
# phantom (tokens the server counted and the log did not), which no refund
# removes. A void takes every booking not confirmed, due or not, as
# ``_window.SlidingLog`` does. A start fits when no instant in the span it holds
# has more than ``limit - cost``; the load rises only where an entry starts,
# and the earliest fit is now (or the block's end) or when an entry leaves.
# Entries are kept a window after they leave, and as long as the slowest
# answer yet (``longest``): a sync counts those the server counted while the
# answer travelled, and an answer finds its booking.
# A member "-<cost>|<ends>|<id>" is one the server showed it counts no longer: it
# holds its tokens until ``ends`` exactly (``_window.SlidingLog.sync``).
# ARGV: op, limit, window, cost, extra, epoch, member, slack, elapsed, reset, late, lead. Ops:
#   reserve   book ARGV[4] as ARGV[7]; refuse, writing nothing, if the wait exceeds ARGV[5]
#   peek      the wait for ARGV[4], consuming nothing
#   confirm   booking ARGV[7] of epoch ARGV[6] goes now, if that epoch holds and
#             nothing blocks: granted, and marked so no void takes it
#   refund    remove booking ARGV[7], confirmed or not, in any epoch
#   answered  the request sent ARGV[9] s ago reached the server ARGV[5] s ago at the
#             latest: its booking holds its tokens until a window after that (and the
#             slack, if that is its send: it may have arrived as late as the slack allows)
#   drain     a 429: the window is full now, block for ARGV[5] seconds, new epoch
#   block     start nothing for ARGV[5] seconds from now, new epoch
#   void      bookings ahead book again (they were placed with a narrower slack), new epoch
#   sync      the server had ARGV[5] left when a request sent ARGV[9] s ago arrived:
#             what it counted beyond the log's own is held as a phantom for a window;
#             with ARGV[11] >= 0 (the count is of this limit; requests may arrive that
#             much apart), answered entries it surely counted before and no longer
#             does end now, and with ARGV[10] >= 0 (its Reset), if none it counted
#             ends by then, the oldest does (a phantom's, one of its tokens)
#   held      ARGV[4] tokens that started ARGV[9] s ago, before the log did, and that
#             the server still counts: a phantom from then (new epoch)
# Reply: {granted, wait, tokens, blocked_for, exhausted_pttl, epoch} (KEYS[3]:
# the shared "quota exhausted" marker; PTTL -2 when absent).
WINDOW = (
    _TOKEN_OP
    + """
local limit, window, slack = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[8])
local span = window + slack
local state = redis.call('HMGET', KEYS[2], 'blocked', 'epoch', 'longest')
local blocked = finite(state[1], 0)
local epoch = finite(state[2], math.floor(now * 1000000))
local fresh = not state[2]  -- a new epoch is kept, or each call would make another
local keep = window + math.max(0, finite(state[3], 0))  -- a time a log is kept: never less
if op == 'answered' and tonumber(ARGV[9]) + window > keep then
  keep = tonumber(ARGV[9]) + window
  redis.call('HSET', KEYS[2], 'longest', num(keep - window))
end
local members, starts, costs, ends, helds = {}, {}, {}, {}, {}
local function read()
  members, starts, costs, ends, helds = {}, {}, {}, {}, {}
  local raw = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  for i = 1, #raw, 2 do
    local member, start = raw[i], tonumber(raw[i + 1])
    local held = finite(string.match(member, '^=[^|]+|([^|]+)|'), nil)  -- answered
    local ends_at = finite(string.match(member, '^%-[^|]+|([^|]+)|'), nil)
                    or math.max(start + span, held or 0)
    if ends_at + keep <= now then
      redis.call('ZREM', KEYS[1], member)
    else
      members[#members + 1] = member
      costs[#costs + 1] = finite(string.match(member, '^[~=!%-]?([^|]+)'), 1)
      starts[#starts + 1] = start
      ends[#ends + 1] = ends_at
      helds[#ends] = held
    end
  end
end
read()
local function load(at)
  local sum = 0
  for i = 1, #starts do
    if starts[i] <= at and at < ends[i] then sum = sum + costs[i] end
  end
  return sum
end
local function slot(c)
  local room = limit - c + 1e-9
  local at_start = {}
  for i = 1, #starts do at_start[i] = load(starts[i]) end
  local earliest = math.max(now, blocked)
  local candidates = {}
  for i = 1, #ends do
    if ends[i] > earliest then candidates[#candidates + 1] = ends[i] end
  end
  table.sort(candidates)
  table.insert(candidates, 1, earliest)
  for _, t in ipairs(candidates) do
    local fits = load(t) <= room
    for i = 1, #starts do
      if fits and starts[i] > t and starts[i] < t + span and at_start[i] > room then
        fits = false
      end
    end
    if fits then return t end
  end
end
local function booked(i)  -- a booking not yet answered, confirmed or not
  local first = string.sub(members[i], 1, 1)
  return first ~= '~' and first ~= '=' and first ~= '-'
end
local function void()
  epoch = epoch + 1
  for i = 1, #members do
    if booked(i) and string.sub(members[i], 1, 1) ~= '!' then
      redis.call('ZREM', KEYS[1], members[i])
    end
  end
end
local function hold(tokens, start)
  if tokens <= 1e-9 then return false end
  void()
  redis.call('ZADD', KEYS[1], num(start), '~' .. num(tokens) .. '|' .. num(now) .. ':' .. epoch)
  return true
end
local function release(i, at)  -- an answered entry holds its tokens until ``at`` exactly
  local ends_at = math.min(at, ends[i])
  local member = '-' .. num(costs[i]) .. '|' .. num(ends_at) .. '|'
                 .. string.match(members[i], '^=[^|]+|[^|]+|(.*)$')
  redis.call('ZREM', KEYS[1], members[i])
  redis.call('ZADD', KEYS[1], num(starts[i]), member)
  members[i], ends[i], helds[i] = member, ends_at, nil
end
local function forget(sent, remaining, late)  -- answered entries the count left out
  local surely, counted = {}, 0
  for i = 1, #members do
    local held = helds[i]
    if held and starts[i] <= sent and sent < ends[i]
       and held - window + late <= sent then
      surely[#surely + 1] = i
      counted = counted + costs[i]
    end
  end
  local forgotten, released = counted + 1 - (limit - remaining), false
  for _, i in ipairs(surely) do  -- the oldest first: ZRANGE is by start
    if costs[i] > forgotten + 1e-9 then break end
    forgotten = forgotten - costs[i]
    release(i, now)
    released = true
  end
  return released
end
-- One token it counted is back by ``at``: the oldest's, if that is ``lead`` sooner or more.
local function reset_by(sent, at, lead)
  local oldest = nil
  for i = 1, #members do
    local first = string.sub(members[i], 1, 1)
    if (first == '=' or first == '-' or first == '~') and starts[i] <= sent
       and sent < ends[i] then
      if ends[i] <= at + TOGETHER then return false end
      if first ~= '-' and not oldest then oldest = i end
    end
  end
  if not oldest or starts[oldest] + span < at + lead then return false end
  if string.sub(members[oldest], 1, 1) == '=' then
    release(oldest, at)
    return true
  end
  -- A phantom stands for as many requests as it holds tokens: one of them leaves.
  local id, cost = string.match(members[oldest], '^~[^|]+|(.*)$'), costs[oldest]
  redis.call('ZREM', KEYS[1], members[oldest])
  if cost > 1 + 1e-9 then
    redis.call('ZADD', KEYS[1], num(starts[oldest]), '~' .. num(cost - 1) .. '|' .. id)
  end
  local gone = '-' .. num(math.min(1, cost)) .. '|' .. num(math.min(at, ends[oldest])) .. '|'
               .. id .. '#' .. num(cost)
  redis.call('ZADD', KEYS[1], num(starts[oldest]), gone)
  return true
end
local granted, wait, write = 0, 0, true
if op == 'reserve' then
  local start = slot(cost)
  wait = start - now
  if wait <= extra then
    granted = 1
    redis.call('ZADD', KEYS[1], num(start), (wait <= 0 and '!' or '') .. ARGV[7])
  end
  write = false
elseif op == 'peek' then
  wait, write = slot(cost) - now, false
elseif op == 'confirm' then
  wait, write = 0, false
  local start = redis.call('ZSCORE', KEYS[1], ARGV[7])
  local marked = redis.call('ZSCORE', KEYS[1], '!' .. ARGV[7])  -- asked again
  if tonumber(ARGV[6]) == epoch and blocked <= now and (start or marked) then
    granted = 1
    if start then
      redis.call('ZREM', KEYS[1], ARGV[7])
      redis.call('ZADD', KEYS[1], start, '!' .. ARGV[7])
    end
  end
elseif op == 'refund' then
  -- The member names one booking alone, so it goes in any epoch: one confirmed
  -- whose holder then gave up (another scope fell short) held a place no one used.
  redis.call('ZREM', KEYS[1], ARGV[7], '!' .. ARGV[7])
  write = false
elseif op == 'answered' then
  -- Its own booking was confirmed; one never confirmed is taken only if none was.
  local sent, mine, unconfirmed = now - tonumber(ARGV[9]), nil, nil
  for i = 1, #members do
    if booked(i) and starts[i] <= sent + 0.005 then
      if string.sub(members[i], 1, 1) == '!' then mine = i else unconfirmed = i end
    end
  end
  mine = mine or unconfirmed
  write = false
  if mine then
    local held = now - extra + window
    if extra >= tonumber(ARGV[9]) then held = held + slack end  -- arrived by its send
    redis.call('ZREM', KEYS[1], members[mine])
    redis.call('ZADD', KEYS[1], num(starts[mine]),
               '=' .. num(costs[mine]) .. '|' .. num(held) .. '|' .. members[mine])
    if held > ends[mine] then
      for i = 1, #members do
        if starts[i] > now and starts[i] < held and booked(i) then write = true end
      end
      if write then void() end
    end
  end
elseif op == 'drain' then
  void()
  local left = limit - load(now)
  if left > 1e-9 then
    redis.call('ZADD', KEYS[1], num(now), '~' .. num(left) .. '|' .. num(now) .. ':' .. epoch)
  end
  blocked = math.max(blocked, now + extra)
elseif op == 'block' then
  if now + extra > blocked then
    void()
    blocked = now + extra
  else
    write = false
  end
elseif op == 'void' then
  void()
elseif op == 'sync' then
  local sent, ours = now - tonumber(ARGV[9]), 0
  for i = 1, #starts do
    if starts[i] <= sent and sent < ends[i] then ours = ours + costs[i] end
  end
  write = hold(limit - extra - ours, now + window - span)
  local reset, late = tonumber(ARGV[10]), tonumber(ARGV[11])
  if not write and late >= 0 then
    write = forget(sent, extra, late)
    if reset >= 0 then write = reset_by(sent, now + reset, tonumber(ARGV[12])) or write end
    if write then void() end
  end
elseif op == 'held' then
  write = hold(cost, now - tonumber(ARGV[9]))
else
  return redis.error_reply('unknown window op ' .. op)
end
if write or fresh then
  redis.call('HSET', KEYS[2], 'blocked', num(blocked), 'epoch', string.format('%d', epoch))
end
read()
local idle = math.max(0, blocked - now)
for i = 1, #ends do idle = math.max(idle, ends[i] + keep - now) end
if #members > 0 then expire(KEYS[1], idle) end
expire(KEYS[2], idle)
local tokens = limit - load(now)
return {granted, num(wait), num(tokens), num(math.max(0, blocked - now)),
        redis.call('PTTL', KEYS[3]), string.format('%d', epoch)}
""".replace("TOGETHER", repr(TOGETHER))
)

# Leases: a sorted set of members scored by their expiry (server time).
# Purge the expired; re-register ARGV[4..] (this process's calls still in
# flight, after Redis lost them: a restart, or slots taken from the fallback
# while it was away); then add ARGV[3] only while fewer than ARGV[1] are live.
# A crashed holder never renews, so its members fall out by themselves.
# Reply: {granted, live leases after the call}.
ACQUIRE_LEASE = (
    _PRELUDE
    + """
local cap, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local expiry = num(now + ttl)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', num(now))
for i = 4, #ARGV do
  redis.call('ZADD', KEYS[1], expiry, ARGV[i])
end
local live = redis.call('ZCARD', KEYS[1])
redis.call('PEXPIRE', KEYS[1], num(math.ceil(ttl * 1000) + 1000))
if live >= cap then return {0, live} end
redis.call('ZADD', KEYS[1], expiry, ARGV[3])
return {1, live + 1}
"""
)

# Push the expiry of the leases ARGV[2..] to now + ARGV[1], adding back any
# that Redis lost (a restart): they are calls still in flight, and counting
# them is what keeps every process under the cap. The reply lists the ones
# that were missing.
RENEW_LEASES = (
    _PRELUDE
    + """
local ttl = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', num(now))
local expiry, missing = num(now + ttl), {}
for i = 2, #ARGV do
  if not redis.call('ZSCORE', KEYS[1], ARGV[i]) then table.insert(missing, ARGV[i]) end
  redis.call('ZADD', KEYS[1], expiry, ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], num(math.ceil(ttl * 1000) + 1000))
return missing
"""
)

# Idempotency: claim KEYS[1] with the pending marker ARGV[1] for ARGV[2] ms (the lease) if
# nobody holds it (reply ''), else reply with what is there (a marker or an answer).
CLAIM = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return '' end
return redis.call('GET', KEYS[1])
"""

# Extend KEYS[1] to ARGV[2] ms only while it still holds our own pending
# marker ARGV[1]: a claim that lapsed, or was taken over, is not ours to renew.
RENEW_CLAIM = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

# Delete KEYS[1] only while it still holds our own pending marker ARGV[1]: an
# answer, or another claimant's marker, is never removed.
RELEASE_CLAIM = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def lua_number(value: float) -> str:
    """``value`` as Lua's ``tonumber`` reads it exactly (it cannot read 'inf')."""
    return repr(min(float(value), FOREVER)) if math.isfinite(value) else repr(FOREVER)


async def bounded(what: str, timeout: float, operation: Callable[[], Awaitable[T]]) -> T:
    """Run one Redis operation for at most ``timeout`` seconds.

    Every failure (refused connection, error reply, no answer in time) becomes
    ``LimiterUnavailableError`` naming ``what`` is unavailable, chained to its
    cause; the message is short and stable because the model may read it.
    The caller's own cancel scopes (the call's deadline) still cut the
    operation shorter, with ``Cancelled``.
    """
    cause: BaseException | None = None
    with trio.move_on_after(timeout):
        try:
            return await operation()
        except (RedisError, OSError) as exc:
            cause = exc
    reason = (
        f"Redis failed ({type(cause).__name__})"
        if cause is not None
        else f"Redis did not answer within {timeout:g}s"
    )
    raise LimiterUnavailableError(f"{what} is unavailable: {reason}") from cause
