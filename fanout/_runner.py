"""The runner: tools, scopes and policies, turned into answered turns.

A ``Runner`` is long-lived: its scopes hold the limits of every key the
tools use, shared by every turn it runs. A ``Turn`` is one assistant
message's calls; build it with ``runner.turn(calls)`` (which validates them)
and ``await turn.run()``, or do both with ``await runner.run_turn(calls)``.

A runner may also be entered (``async with runner:``). Its turns then run
their calls in the runner's nursery, and a turn returns as soon as every
call is answered: calls stopped at the deadline finish unwinding (a library
closing a thousand hung connections) after the turn has returned, and the
``async with`` block waits for them at its end.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Self, TypedDict, Unpack

import attrs
import trio

from ._call import CallPlan, CallSettings, CallState
from ._canonical import SHORTEST_CAP, canonical_arguments, shown
from ._collector import collection_paused
from ._events import Instrument, Recorder
from ._exceptions import ConfigurationError, InvalidTurnError, UsageError
from ._going_up import keyboard_interrupt_in, only_going_up
from ._redact import redact_text
from ._registry import Registry
from ._retry import RetryPolicy
from ._run import Run
from ._scope import Scope, ScopeLike, ScopeStatistics
from ._streaming import StreamingTurn
from ._trio_runs import current_run
from ._turn import MutatingPolicy, OnFailure, Turn, TurnCounts
from ._validate import require_at_least, require_non_negative, require_positive
from ._values import ToolCall

if TYPE_CHECKING:
    import contextlib
    from collections.abc import AsyncIterable, Callable, Sequence
    from types import TracebackType

    from ._streams import StreamDecoder

__all__ = ["Runner", "RunnerStatistics"]


class TurnOptions(TypedDict, total=False):
    """What running a turn may be told: the run it belongs to, and its own timeout."""

    run: Run | None
    timeout: float | None


@attrs.frozen
class RunnerStatistics:
    """A snapshot of the runner: its turns and every scope it knows."""

    turns_started: int
    turns_running: int
    scopes: tuple[ScopeStatistics, ...]


class Runner:
    """Runs turns of tool calls against a registry, within shared scopes.

    ``turn_timeout`` is each turn's hard deadline in seconds. ``mutating``
    says how writes in one turn run: ``"one"`` (the first runs, the rest are
    refused with a request to re-issue them alone), ``"serial"`` or
    ``"parallel"``. ``on_failure="cancel_siblings"`` cancels a turn's
    unfinished calls when one fails. ``inline_wait`` is the longest wait
    slept invisibly; a longer one is answered ``rate_limited`` with its
    ``retry_after_ms`` (None: be patient, wait up to each call's budget).
    A scope a tool names but ``scopes`` does not configure starts with no
    limits, and obeys what servers tell it.
    """

    def __init__(
        self,
        registry: Registry,
        *,
        scopes: Iterable[ScopeLike] = (),
        turn_timeout: float = 60.0,
        mutating: MutatingPolicy = "one",
        on_failure: OnFailure = "continue",
        retry: RetryPolicy | None = None,
        inline_wait: float | None = 2.0,
        max_output_chars: int = 8000,
        max_threads: int = 16,
        rng: random.Random | None = None,
        instruments: Sequence[Instrument] = (),
        trace: bool = True,
    ) -> None:
        _check_parts(registry, scopes, instruments, rng, trace)
        if mutating not in ("one", "serial", "parallel"):
            raise ConfigurationError(
                f"mutating must be 'one', 'serial' or 'parallel', not {mutating!r}"
            )
        if on_failure not in ("continue", "cancel_siblings"):
            raise ConfigurationError(
                f"on_failure must be 'continue' or 'cancel_siblings', not {on_failure!r}"
            )
        require_positive("turn_timeout", turn_timeout)
        if inline_wait is not None:
            require_non_negative("inline_wait", inline_wait)
        require_at_least("max_output_chars", max_output_chars, SHORTEST_CAP)
        require_at_least("max_threads", max_threads, 1)
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigurationError(f"retry must be a RetryPolicy or None, not {retry!r}")
        for instrument in instruments:
            if not callable(getattr(instrument, "on_event", None)):
                raise ConfigurationError(f"an instrument needs an on_event method: {instrument!r}")
        self.registry = registry
        self.turn_timeout = turn_timeout
        self.mutating: MutatingPolicy = mutating
        self.on_failure: OnFailure = on_failure
        self.instruments = tuple(instruments)
        self._trace = trace
        self._scopes: dict[str, ScopeLike] = {}
        for scope in scopes:
            if not isinstance(getattr(scope, "name", None), str) or not callable(
                getattr(scope, "acquire_slot", None)
            ):
                raise ConfigurationError(f"scopes holds a {type(scope).__name__}, not a scope")
            if scope.name in self._scopes:
                raise ConfigurationError(f"two scopes are named {scope.name!r}")
            self._scopes[scope.name] = scope
        self._settings = CallSettings(
            retry=retry or RetryPolicy(),
            inline_wait=inline_wait,
            max_output_chars=max_output_chars,
            threads=trio.CapacityLimiter(max_threads),
        )
        self._rng = rng or random.Random()
        self._turn_serial = 0
        self._counts = TurnCounts()
        self._nursery: trio.Nursery | None = None
        self._nursery_manager: contextlib.AbstractAsyncContextManager[trio.Nursery] | None = None
        self._run: object | None = None  # the trio.run of its latest turn (`_turn_begins`)

    async def __aenter__(self) -> Self:
        """Open the runner's nursery, where its turns' calls run and unwind."""
        if self._nursery_manager is not None:
            raise UsageError("this runner is already open; enter it once")
        # Opening a nursery does not yield; an async method does (trio's rule), before
        # anything opens, so a cancellation here leaves the runner closed.
        await trio.lowlevel.checkpoint()
        manager = trio.open_nursery()
        self._nursery = await manager.__aenter__()
        self._nursery_manager = manager
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        """Wait for calls still unwinding, then close the nursery."""
        manager = self._nursery_manager
        assert manager is not None
        self._nursery = None
        try:
            suppressed = await manager.__aexit__(kind, exc, tb)
        except BaseExceptionGroup as group:
            # A KeyboardInterrupt from a call's task (and the cancellations it caused)
            # comes out of the block as itself, as from a turn not opened: in the
            # nursery's group, `except KeyboardInterrupt` caught nothing.
            interrupt = keyboard_interrupt_in(group)
            if interrupt is not None and only_going_up(group):
                raise interrupt from None
            raise
        finally:
            self._nursery_manager = None
        if kind is None:  # a nursery with nothing left to wait for does not yield; we do
            await trio.lowlevel.checkpoint()
        return suppressed

    def scope(self, name: str) -> ScopeLike:
        """The scope called ``name``; if none was configured, made with the registry's
        defaults for it (`Registry.set_scope_defaults`), or told no limits (it learns)."""
        if name not in self._scopes:
            self._scopes[name] = Scope(name, **self.registry.scope_defaults(name))
        return self._scopes[name]

    def turn(
        self, calls: Iterable[ToolCall], *, run: Run | None = None, timeout: float | None = None
    ) -> Turn:
        """Validate ``calls`` and build their turn (not yet running).

        ``run`` is the conversation the turn belongs to; without one the turn
        is a run of its own (nothing is remembered across turns). Raises
        ``InvalidTurnError`` when the calls cannot be answered one result
        per id: an id that is missing, empty or repeated. ``timeout``
        overrides the runner's ``turn_timeout`` for this turn.
        """
        if not isinstance(calls, Iterable) or isinstance(calls, str | bytes | Mapping):
            raise InvalidTurnError(f"a turn takes a list of ToolCall, not {type(calls).__name__}")
        given = _validated(list(calls))
        state_for, options = self._turn_parts(run, timeout)
        with collection_paused():  # every state built is kept (fanout._collector)
            states = [state_for(call, i) for i, call in enumerate(given)]
        return Turn(states, **options)

    def stream_turn(
        self,
        events: AsyncIterable[Any],
        decoder: StreamDecoder,
        *,
        run: Run | None = None,
        timeout: float | None = None,
    ) -> StreamingTurn:
        """Build a turn fed by a model's stream (not yet running).

        ``events`` is the SDK's stream (or any async iterable of its events),
        ``decoder`` the matching reader (``AnthropicStream()``,
        ``ChatCompletionsStream()``, ``ResponsesStream()``). When run, the
        turn reads the stream itself and starts each read the moment its
        block is complete; its deadline covers the stream.
        """
        state_for, options = self._turn_parts(run, timeout)
        return StreamingTurn(events, decoder, state_for, **options)

    def _turn_begins(self, run: Run) -> trio.Nursery | None:
        """Ready the runner, its scopes and ``run`` for the trio.run going on; the
        runner's nursery, if it is open.

        A runner may serve many trio.runs (built at import, a notebook's run per
        question), and what it keeps on trio's clock means nothing in a new one
        (`fanout._trio_runs`). Asked once a turn, not once a call.
        """
        now_in = current_run()
        if now_in is not self._run:
            self._enter_run(now_in)
        run.note_run(now_in)
        return self._nursery

    def _enter_run(self, now_in: object) -> None:
        """Its first turn in a trio.run: every scope is made afresh if its times are of an
        earlier run (a runner's first turn too: a scope may have been built in one), and
        threads abandoned in an earlier run no longer hold places (`CallSettings`)."""
        if self._run is not None:
            self._settings.threads = trio.CapacityLimiter(self._settings.threads.total_tokens)
        for scope in self._scopes.values():
            scope.note_run(now_in)
        self._run = now_in

    def _turn_parts(
        self, run: Run | None, timeout: float | None
    ) -> tuple[Callable[[ToolCall, int], CallState], dict[str, Any]]:
        """What every turn is built from: how a call becomes its state, and the turn's options."""
        if timeout is not None:
            require_positive("timeout", timeout)
        if run is not None and not isinstance(run, Run):
            raise UsageError(f"run must be a fanout.Run (or None), not {type(run).__name__}")
        run = run if run is not None else Run()
        # Each call's seed is the turn's and its id (`CallPlan`): the turn's part spelled once.
        seed_of_turn = f"{self._rng.getrandbits(64)}:"
        self._turn_serial += 1

        # The scopes each set of names stands for, looked up once per turn, not once per call.
        scopes_of: dict[tuple[str, ...], tuple[ScopeLike, ...]] = {}

        def state_for(call: ToolCall, position: int) -> CallState:
            if call.position != position:
                call = ToolCall(call.id, call.name, call.arguments, position)
            spec = self.registry.get(call.name)
            scopes: tuple[ScopeLike, ...] = ()
            if spec is not None:
                if spec.scopes not in scopes_of:
                    names = sorted(set(spec.scopes))
                    scopes_of[spec.scopes] = tuple(self.scope(n) for n in names)
                scopes = scopes_of[spec.scopes]
            spelled = canonical_arguments(call.arguments) if call.arguments_valid else ""
            seed = f"{seed_of_turn}{call.id}"
            return CallState(CallPlan(call, spec, scopes, run.run_id, spelled, seed))

        options: dict[str, Any] = {
            "registry": self.registry,
            "timeout": self.turn_timeout if timeout is None else timeout,
            "run": run,
            "mutating": self.mutating,
            "on_failure": self.on_failure,
            "settings": self._settings,
            "recorder": Recorder(
                self.instruments,
                [] if self._trace else None,
                turn_id=f"turn-{self._turn_serial}",
            ),
            "counts": self._counts,
            "begin": lambda: self._turn_begins(run),
        }
        return state_for, options

    async def run_turn(self, calls: Iterable[ToolCall], **options: Unpack[TurnOptions]) -> Turn:
        """Build and run a turn (`turn`); return it with every call answered, within its
        deadline counted from this call."""
        since = trio.current_time()
        turn = self.turn(calls, **options)
        await turn.run(since=since)
        return turn

    async def run_stream(
        self, events: AsyncIterable[Any], decoder: StreamDecoder, **options: Unpack[TurnOptions]
    ) -> StreamingTurn:
        """Build and run a streaming turn (`stream_turn`); return it with every call
        answered, within its deadline counted from this call."""
        since = trio.current_time()
        turn = self.stream_turn(events, decoder, **options)
        await turn.run(since=since)
        return turn

    def statistics(self) -> RunnerStatistics:
        return RunnerStatistics(
            turns_started=self._counts.started,
            turns_running=self._counts.running,
            scopes=tuple(
                _named_safely(self._scopes[name].statistics()) for name in sorted(self._scopes)
            ),
        )


def _named_safely(stats: ScopeStatistics) -> ScopeStatistics:
    """``stats`` with no credential in its scope's name: a scope named with its key (as the
    README's own example once did) printed it in every snapshot, where the trace did not."""
    name = redact_text(stats.name)
    return stats if name == stats.name else attrs.evolve(stats, name=name)


def _validated(calls: Sequence[ToolCall]) -> list[ToolCall]:
    """The calls, each with an id of its own and a tool name, or an ``InvalidTurnError``.

    An id or name that is a ``str`` subclass (a proxy, a lazy string) is taken as
    its plain text: its own ``__hash__``, ``__eq__`` or ``__len__`` ran as the
    turn compared ids, and one that raised escaped ``run_turn`` as itself.
    """
    seen: set[str] = set()
    checked = []
    for call in calls:
        if not isinstance(call, ToolCall):
            raise InvalidTurnError(f"a turn is made of ToolCall values, not {type(call).__name__}")
        call_id, name = call.id, call.name
        if call_id.__class__ is not str or name.__class__ is not str:  # a rare one: a subclass
            call_id, name = _plain_text(call_id), _plain_text(name)
        if not call_id:
            raise InvalidTurnError(f"call #{call.position} ({shown(name)}) has no id")
        if call_id in seen:
            raise InvalidTurnError(
                f"two calls share the id {shown(call_id)}; each id needs one answer"
            )
        seen.add(call_id)
        if not name:
            raise InvalidTurnError(f"call {shown(call_id)} has no tool name")
        if call_id is not call.id or name is not call.name:
            call = attrs.evolve(call, id=call_id, name=name)
        checked.append(call)
    return checked


def _plain_text(value: object) -> str:
    """``value`` as plain text if it is text (a subclass's own methods never run), else ""."""
    return str.__str__(value) if isinstance(value, str) else ""


def _check_parts(
    registry: object, scopes: object, instruments: object, rng: object, trace: object
) -> None:
    """A runner's parts are what they say they are, or a ``ConfigurationError`` now:
    taken on trust, ``Runner(object())`` or ``rng=3`` failed only as a turn ran."""
    if not isinstance(registry, Registry):
        raise ConfigurationError(
            f"registry must be a fanout.Registry, not {type(registry).__name__}"
        )
    for name, parts in (("scopes", scopes), ("instruments", instruments)):
        if not isinstance(parts, Iterable) or isinstance(parts, str | bytes | Mapping):
            raise ConfigurationError(f"{name} must be a list, not {type(parts).__name__}")
    if rng is not None and not isinstance(rng, random.Random):
        raise ConfigurationError(f"rng must be a random.Random or None, not {type(rng).__name__}")
    if not isinstance(trace, bool):
        raise ConfigurationError(f"trace must be True or False, not {trace!r}")
