"""Idempotency keys on Redis, so a write re-issued by another process runs once.

A claim is ``SET key <pending marker> NX PX lease`` in one script with the
read of whatever is there instead, so two processes claiming at once cannot
both see NEW. The marker is unique per claim: ``renew`` extends and
``abandon`` deletes a key only while it still holds this store's own marker,
never an answer and never another process's claim. ``finish`` replaces the
marker with the answer as JSON, kept for the answers' TTL.

Failures: ``claim`` raises ``LimiterUnavailableError`` (a write whose key
cannot be checked must not run: fail closed). ``renew``, ``finish`` and
``abandon`` are bounded by ``op_timeout`` and log instead of raising. A claim
whose holder died lapses with its lease, within seconds.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import TYPE_CHECKING, Any, Self

import attrs
import trio
from coredis.commands.script import Script

from ._exceptions import LimiterUnavailableError
from ._idempotency import Claim, ClaimState, StoredAnswer
from ._redis_client import RedisClient, a_client, a_prefix, client_from_url
from ._redis_scripts import CLAIM, RELEASE_CLAIM, RENEW_CLAIM, bounded
from ._validate import positive
from ._values import Status

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from types import TracebackType

    from ._idempotency import IdempotencyStore

__all__ = ["RedisIdempotencyStore"]

_log = logging.getLogger("fanout.redis")
_PENDING = "pending:"


@attrs.define(eq=False)
class RedisIdempotencyStore:
    """Claims and answers under ``prefix + "idem:" + key``, expiring on Redis's clock.

    Pass a coredis client the caller has entered, or use ``from_url`` and
    ``async with store:``.
    """

    client: RedisClient = attrs.field(repr=False, validator=a_client)
    prefix: str = attrs.field(default="fanout:", validator=a_prefix)
    op_timeout: float = attrs.field(default=0.25, validator=positive)
    _owns_client: bool = attrs.field(init=False, default=False)
    _markers: dict[str, str] = attrs.field(init=False, factory=dict)
    _scripts: dict[str, Script[Any]] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        self._scripts = {
            "claim": self.client.register_script(CLAIM),
            "release": self.client.register_script(RELEASE_CLAIM),
            "renew": self.client.register_script(RENEW_CLAIM),
        }

    @classmethod
    def from_url(cls, url: str, *, cluster: bool = False, **options: Any) -> RedisIdempotencyStore:
        """A store with a client of its own, opened by ``async with store:``.

        ``rediss://`` connects over TLS; ``cluster=True`` treats ``url`` as a
        startup node of a Redis Cluster (each claim touches one key, so any
        slot will do).
        """
        client = client_from_url(url, cluster=cluster)
        store = cls(client, **options)
        store._owns_client = True
        return store

    async def __aenter__(self) -> Self:
        if self._owns_client:
            await self.client.__aenter__()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._owns_client:
            await self.client.__aexit__(None, None, None)

    def _key(self, key: str) -> str:
        return f"{self.prefix}idem:{key}"

    async def claim(self, key: str, *, lease: float) -> Claim:
        """NEW (the key is ours for ``lease`` s), RUNNING (claimed elsewhere) or DONE."""
        marker = f"{_PENDING}{uuid.uuid4().hex}"
        args = [marker, str(_milliseconds(lease))]
        found: object = await bounded(
            "the idempotency store", self.op_timeout,
            lambda: self._scripts["claim"](keys=[self._key(key)], args=args),
        )  # fmt: skip
        text = _text(found)
        if text == "":
            self._markers[key] = marker
            return Claim(ClaimState.NEW)
        if text.startswith(_PENDING):
            return Claim(ClaimState.RUNNING)
        try:
            stored = json.loads(text)
            content = stored["content"]
            if not isinstance(content, str):  # fanout writes text; replayed by its repr, not
                raise TypeError(f"stored content is {type(content).__name__}, not text")
            answer = StoredAnswer(Status(stored["status"]), content)
        except (ValueError, TypeError, KeyError) as exc:
            raise LimiterUnavailableError(
                "the idempotency store holds an answer fanout cannot read"
            ) from exc
        return Claim(ClaimState.DONE, answer)

    async def renew(self, key: str, *, lease: float) -> bool:
        """Extend our own pending claim to ``lease`` s; False once it is no longer ours."""
        marker = self._markers.get(key)
        if marker is None:
            await trio.lowlevel.checkpoint()
            return False
        args = [marker, str(_milliseconds(lease))]
        renewed: object = await bounded(
            "the idempotency store", self.op_timeout,
            lambda: self._scripts["renew"](keys=[self._key(key)], args=args),
        )  # fmt: skip
        return bool(int(str(renewed)))

    async def finish(self, key: str, answer: StoredAnswer, *, ttl: float) -> None:
        """Store the tool's answer for ``ttl`` seconds, for every later claimant."""
        self._markers.pop(key, None)
        text = json.dumps({"status": answer.status.value, "content": answer.content})
        await self._quietly(
            "finish",
            lambda: self.client.set(self._key(key), text, px=_milliseconds(ttl)),
        )

    async def abandon(self, key: str) -> None:
        """Release our pending claim (the effect is unknown), leaving answers alone."""
        marker = self._markers.pop(key, None)
        if marker is None:
            await trio.lowlevel.checkpoint()
            return
        await self._quietly(
            "abandon",
            lambda: self._scripts["release"](keys=[self._key(key)], args=[marker]),
        )

    async def _quietly(self, op: str, operation: Callable[[], Awaitable[object]]) -> None:
        # Not shielded here: the runner shields its settling, bounded by the
        # write's deadline, and a shield of our own would outlive that bound.
        try:
            await bounded("the idempotency store", self.op_timeout, operation)
        except LimiterUnavailableError as exc:
            _log.warning("%s (on %s: %r); the claim lapses with its lease", exc, op, exc.__cause__)


def _milliseconds(ttl: float) -> int:
    return max(1, round(ttl * 1000))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


if TYPE_CHECKING:

    def _fits_the_protocol(store: RedisIdempotencyStore) -> IdempotencyStore:
        return store  # mypy checks that the store implements IdempotencyStore
