"""What a run remembers of its calls, for those who store it elsewhere or look inside.

Most code never imports this: ``fanout.Run()`` keeps claims and answers in
memory, and ``fanout.redis.RedisIdempotencyStore`` shares them between
processes. Import from here to write a store of your own (the
``IdempotencyStore`` protocol and the values it trades in: ``Claim``,
``ClaimState``, ``StoredAnswer``), to reach a run's read cache
(``Run.cache``, a ``ReadCache``), or to compute a write's key where fanout
does not run (``idempotency_key``, over ``canonical_json`` of the
arguments); inside a tool, ``fanout.current_call().idempotency_key`` has it.
"""

from ._canonical import canonical_json as canonical_json
from ._canonical import idempotency_key as idempotency_key
from ._idempotency import Claim as Claim
from ._idempotency import ClaimState as ClaimState
from ._idempotency import IdempotencyStore as IdempotencyStore
from ._idempotency import MemoryIdempotencyStore as MemoryIdempotencyStore
from ._idempotency import StoredAnswer as StoredAnswer
from ._run import ReadCache as ReadCache

__all__ = [
    "Claim",
    "ClaimState",
    "IdempotencyStore",
    "MemoryIdempotencyStore",
    "ReadCache",
    "StoredAnswer",
    "canonical_json",
    "idempotency_key",
]
