"""A turn fed by a model's stream: each read starts the moment its block is complete.

For deadline-focused agents the latency of a turn should be the longer of
generating the message and running its tools, not their sum. The turn
machinery (``Turn``) admits calls as they arrive; this module supplies them
from a stream, through a decoder of the SDK's events (``_streams``), and
answers what a stream leaves unfinished.
"""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING, Any

import trio

from ._call import describe
from ._canonical import shown
from ._exceptions import FanoutError, InvalidTurnError, UsageError
from ._going_up import goes_up
from ._logs import log_failure
from ._turn import Turn, model_order
from ._values import ToolCall

if TYPE_CHECKING:
    from collections.abc import AsyncIterable, AsyncIterator, Callable

    from ._call import CallState
    from ._streams import StreamDecoder

__all__ = ["StreamingTurn"]

_log = logging.getLogger("fanout")

_YIELD_EVERY = 64  # events read without a completed call, between two yields to trio


class StreamingTurn(Turn):
    """A turn fed by a model's stream: each read starts the moment its block is complete.

    Build it with ``Runner.stream_turn(events, decoder)``. Running it reads
    the stream; every call is checked as it arrives (single-flight and the
    run's cache apply to calls that arrive later too), reads start in the
    model's order while the message is still being written, and writes wait
    for its end, since the mutating policy needs the whole set. The turn's
    deadline covers the stream. A call whose block had begun when the
    stream ended, broke off, or was cut off is answered too (``error``,
    ``timed_out`` or ``cancelled``), never lost; writes of a message that
    broke off are refused. The answers are those a turn built from the
    finished message would give, in its order: the order the calls began,
    however their blocks ended (Anthropic's and Responses' may interleave).

    The stream's own error (a dropped connection, two calls with one id) is
    raised from ``run()`` once every call seen is answered.

    A call failing under ``cancel_siblings`` stops the calls, not the reading:
    the rest of the message is read to its end (each call in it answered
    ``cancelled``), so that the SDK's stream, whose final message the next
    request needs, is whole. (Cancelled in the middle of a read, the SDK's
    stream was closed: Anthropic's final message was cut short, and the
    Responses helper's ``get_final_response()`` raised.) The deadline still
    stops both.
    """

    _calls_own_scopes = True

    def __init__(
        self,
        events: AsyncIterable[Any],
        decoder: StreamDecoder,
        state_for: Callable[[ToolCall, int], CallState],
        **options: Any,
    ) -> None:
        if not hasattr(events, "__aiter__"):  # else the turn would end at once, empty
            raise UsageError(
                f"a streaming turn reads an async iterable of stream events, not "
                f"{type(events).__name__}: enter a stream manager first (async with "
                f"client.messages.stream(...) as stream) or await a coroutine (await "
                f"client.messages.create(..., stream=True)), and pass what it gives"
            )
        super().__init__([], **options)
        self._events = events
        self._decoder = decoder
        self._state_for = state_for
        self._iterator: AsyncIterator[Any] | None = None
        self._ended = False
        self._stream_error: BaseException | None = None
        # The ids of the calls so far: a repeated one spoils the stream. (Compared with
        # each call before it, 8,000 calls in one chunk held the loop for seconds.)
        self._ids: set[str] = set()

    async def run(self, *, since: float | None = None) -> None:
        """Read the stream and run every call to its answer under the turn's deadline
        (counted from ``since``, if before now: `Turn.run`)."""
        await self._run_to_the_end(since)
        if self._stream_error is not None:
            raise self._stream_error

    async def _arrivals(self) -> list[CallState] | None:
        if self._ended:
            await trio.lowlevel.checkpoint()
            return None
        read = 0
        while True:
            read += 1
            if read % _YIELD_EVERY == 0:
                # A stream that has its events at hand (a body read whole, a replay)
                # never waits: without a yield, the deadline could not stop a message of
                # 100,000 pieces until it was all read (2.1 s for a 0.5 s turn).
                await trio.lowlevel.checkpoint()
            try:
                if self._iterator is None:  # its own errors are the stream's, as its events'
                    self._iterator = self._events.__aiter__()
                event = await self._iterator.__anext__()
            except StopAsyncIteration:
                return self._end("the message ended before this call's arguments were complete")
            except BaseException as exc:
                # A cancellation or a KeyboardInterrupt is the caller's; anything else, a
                # SystemExit or a library's own BaseException as much as a dropped
                # connection, is the stream's error. Raised on, a stream's SystemExit was
                # taken for fanout failing: every call was answered "a failure of the
                # runtime" (reads running fine among them) and the error was lost.
                if goes_up(exc):
                    raise
                self._stream_error = _as_the_streams(exc)
                return self._end(
                    f"the stream broke off ({describe(exc)}) before this call's arguments "
                    "were complete"
                )
            if self._ended:
                # Cut off while it read (the deadline, the caller): the calls it had begun
                # are answered already, and what came since is not the turn's.
                return None
            arrived = [state for call in self._decoded(event) if (state := self._add(call))]
            if self._stream_error is not None:
                # Those that came whole with the fault are arrivals too: left out, they
                # were answered as if the caller had cancelled the turn.
                return arrived + self._end("the stream was invalid before this call was complete")
            if arrived:
                return arrived

    def _decoded(self, event: Any) -> list[ToolCall]:
        """The calls ``event`` completes. A decoder that fails on it (an event no SDK
        writes: ``"tool_calls": 7``) spoils the stream with an `InvalidTurnError`, as
        `run_turn` refuses such a message; raised as itself, a bare ``TypeError`` came out
        of ``run_stream``."""
        try:
            return self._decoder.feed(event)
        except BaseException as exc:
            if goes_up(exc):  # the caller's, as above
                raise
            error = exc
            if not isinstance(exc, FanoutError):
                error = InvalidTurnError(
                    f"the stream held an event that cannot be read ({describe(exc)})"
                )
                error.__cause__ = exc
            self._stream_error = error
            return []

    def _add(self, call: ToolCall, problem: str | None = None) -> CallState | None:
        """A call that arrived, as the turn's next state; a repeated id, or none, spoils
        the stream, as it makes `run_turn` refuse the whole message. (A ``tool_use`` block
        with ``"id": ""`` ran, a write among them, answered with an empty id that no API
        takes back.)"""
        if not call.id:
            self._stream_error = self._stream_error or InvalidTurnError(
                f"a call in the stream ({shown(call.name)}) has no id; each call needs one "
                "to be answered"
            )
            return None
        if call.id in self._ids:
            self._stream_error = InvalidTurnError(
                f"two calls in the stream share the id {shown(call.id)}; each id needs one answer"
            )
            return None
        state = self._state_for(call, call.position)
        state.problem = problem
        # In the model's order, as `run_turn` answers the finished message: interleaved
        # blocks end in another order than they began.
        bisect.insort(self._states, state, key=model_order)
        self._ids.add(call.id)
        return state

    def _end(self, why: str) -> list[CallState]:
        """The stream is over: its unfinished calls arrive, to be answered ``error`` (none
        if the turn was cut off first: they are answered already)."""
        if self._ended:
            return []
        self._ended = True
        arrived = [self._add(call, why) for call in self._unfinished()]
        return [state for state in arrived if state is not None]

    def _unfinished(self) -> list[ToolCall]:
        try:
            begun = self._decoder.unfinished()
        except Exception as exc:
            log_failure(
                _log, "fanout: a stream decoder failed to list its unfinished calls", exc=exc
            )
            return []
        return [
            ToolCall(u.id, u.name or "<no tool name>", u.received or "", u.position) for u in begun
        ]

    def _arrivals_cut_off(self) -> None:
        if not self._ended:
            self._ended = True
            for call in self._unfinished():
                self._add(call)

    def _stop_the_calls(self) -> None:
        """A sibling failed: stop the calls, each under its own scope, and read on."""
        self._stopping = True
        self._cancel_running()

    async def _mutating_phase(self, writes: list[CallState]) -> None:
        if self._stream_error is None:
            await super()._mutating_phase(writes)
            return
        await trio.lowlevel.checkpoint()
        for state in writes:
            self._refuse(
                state,
                "the message broke off before it was complete; a write from an incomplete "
                "message is not run. Re-request it if still needed",
            )


def _as_the_streams(exc: BaseException) -> BaseException:
    """The stream's own error, to raise once its calls are answered: a ``Cancelled`` it
    kept from an earlier cancellation and raised again (alone or in a group), when
    nothing around it was cancelled, is no cancellation of the caller's. Raised as
    itself, it went through every scope of the caller's and ended ``trio.run``."""
    if not isinstance(exc, trio.Cancelled | BaseExceptionGroup):
        return exc
    if isinstance(exc, BaseExceptionGroup) and exc.split(trio.Cancelled)[0] is None:
        return exc
    error = RuntimeError("the stream raised a cancellation when nothing had cancelled it")
    error.__cause__ = exc
    return error
