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

from ._exceptions import LimiterUnavailableError

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
    "bounded",
    "lua_number",
]

T = TypeVar("T")

FOREVER = 1e12  # "no limit on the wait", as a number Lua's tonumber can read

_PRELUDE = """
local function num(x) return string.format('%.17g', x) end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
"""

# The token bucket of ``_bucket.py``, kept in a hash {tokens, updated, blocked}.
# Tokens may go negative: a negative balance is the queue of reservations
# already promised (GCRA's virtual scheduling). Ops:
#   reserve  wait for ARGV[4] tokens; refuse, writing nothing, if it exceeds ARGV[5]
#   peek     the wait for ARGV[4] tokens, consuming nothing
#   refund   hand ARGV[4] tokens back (capped at the burst)
#   drain    a 429: tokens to at most 0, and block for ARGV[5] seconds from now
#   block    start nothing for ARGV[5] seconds from now, without draining
# A missing hash is a full, unblocked bucket, so the key expires once it
# would refill and unblock: idle scopes leave nothing behind.
# Reply: {granted, wait, tokens, blocked_for, exhausted_pttl} (KEYS[2] is the
# shared "quota exhausted" marker; its PTTL is -2 when absent).
BUCKET = (
    _PRELUDE
    + """
local op = ARGV[1]
local rate, burst = tonumber(ARGV[2]), tonumber(ARGV[3])
local cost, extra = tonumber(ARGV[4]), tonumber(ARGV[5])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'updated', 'blocked')
local tokens = tonumber(state[1]) or burst
local updated = tonumber(state[2]) or now
local blocked = tonumber(state[3]) or 0
if rate > 0 then
  tokens = math.min(burst, tokens + math.max(0, now - updated) * rate)
end
local function wait_for(c)
  local blocked_for = math.max(0, blocked - now)
  if rate <= 0 then return blocked_for end
  local available = math.min(burst, tokens + blocked_for * rate)
  return blocked_for + math.max(0, c - available) / rate
end
local granted, wait, write = 0, 0, true
if op == 'reserve' then
  wait = wait_for(cost)
  if wait <= extra then
    granted = 1
    if rate > 0 then tokens = tokens - cost end
  else
    write = false
  end
elseif op == 'peek' then
  wait, write = wait_for(cost), false
elseif op == 'refund' then
  if rate > 0 then tokens = math.min(burst, tokens + cost) end
elseif op == 'drain' then
  tokens = math.min(tokens, 0)
  blocked = math.max(blocked, now + extra)
elseif op == 'block' then
  blocked = math.max(blocked, now + extra)
else
  return redis.error_reply('unknown bucket op ' .. op)
end
if write then
  redis.call('HSET', KEYS[1], 'tokens', num(tokens), 'updated', num(now), 'blocked', num(blocked))
  local idle = math.max(0, blocked - now)
  if rate > 0 then idle = math.max(idle, (burst - tokens) / rate) end
  redis.call('PEXPIRE', KEYS[1], num(math.ceil(idle * 1000) + 1000))
end
return {granted, num(wait), num(tokens), num(math.max(0, blocked - now)),
        redis.call('PTTL', KEYS[2])}
"""
)

# Leases: a sorted set of members scored by their expiry (server time).
# Purge the expired, then add ARGV[3] only while fewer than ARGV[1] are live.
# A crashed holder never renews, so its members fall out by themselves.
# Reply: {granted, live leases after the call}.
ACQUIRE_LEASE = (
    _PRELUDE
    + """
local cap, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', num(now))
local live = redis.call('ZCARD', KEYS[1])
if live >= cap then return {0, live} end
redis.call('ZADD', KEYS[1], num(now + ttl), ARGV[3])
redis.call('PEXPIRE', KEYS[1], num(math.ceil(ttl * 1000) + 1000))
return {1, live + 1}
"""
)

# Push the expiry of the leases ARGV[2..] to now + ARGV[1]. A lease no longer
# there is never re-added (it may have just been released); the reply lists
# those, and the caller warns about any it still believes it holds.
RENEW_LEASES = (
    _PRELUDE
    + """
local ttl = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', num(now))
local expiry, missing = num(now + ttl), {}
for i = 2, #ARGV do
  if redis.call('ZADD', KEYS[1], 'XX', 'CH', expiry, ARGV[i]) == 0
     and not redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    table.insert(missing, ARGV[i])
  end
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
