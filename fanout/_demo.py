"""The demo: one agent turn against a throttled API on 127.0.0.1, shown as it happens.

``python -m fanout demo`` is the first thing a newcomer runs, so it must work
from a fresh clone with no network and no configuration, finish in seconds
and exit 0, and show the things fanout exists for:

* a support agent's turn of about a dozen calls: reads on two API keys with
  different limits, the same search asked twice, and two writes;
* the ``tickets`` key is configured with its published limits, so calls
  beyond its burst wait for a token instead of earning 429s; the ``crm`` key
  is not configured at all, so fanout lets one call out alone (the probe)
  and takes the limits the server states in its headers;
* the server answers its first request with a 500 (``--faults``), so a retry
  with backoff is visible;
* the repeated search runs once and both ids get the answer (single-flight);
* under the default write policy ``one`` the second write is refused, with a
  message telling the model to re-request it alone: the demo keeps the
  library's defaults so that what it shows is what you get (``--policy
  serial`` runs both writes in order).

``--stream`` has the model's message arrive as a stream (Anthropic's stream
events, paced in-process over a few seconds): each read starts the moment its
block is complete, while the rest of the message is still being written, and
the writes wait for its end.

Then it prints the exact message that goes back to the model and a summary
checked against the server's own record of every request. ``--json`` prints
one machine-readable document instead. Live output is driven by a
``fanout.Instrument``; ANSI redrawing only happens on a terminal.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import urlsplit

import attrs
import trio

from ._adapters import anthropic_tool_results
from ._events import Event, EventKind
from ._http import http_client
from ._registry import Registry
from ._runner import Runner
from ._scope import Scope
from ._streams import AnthropicStream
from ._throttle_server import KeyLimits, RequestRecord, ServerConfig, serve_throttled
from ._turn import MutatingPolicy, Turn
from ._values import Kind, Status, ToolCall

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import httpx

__all__ = ["DemoOptions", "DemoOutcome", "play", "run_demo"]

TICKETS_KEY = "demo-tickets-key"
CRM_KEY = "demo-crm-key"
CRM_RATE, CRM_BURST = 2.0, 2  # the CRM's limits: fanout is not told them, it learns them

_TICKETS = {
    101: {"subject": "Refund not received", "customer": 7, "status": "open"},
    102: {"subject": "Charged twice for March", "customer": 8, "status": "open"},
    103: {"subject": "Refund to an expired card", "customer": 9, "status": "waiting"},
}
_CUSTOMERS = {
    7: {"name": "Ada Lovelace", "plan": "pro", "since": 2019},
    8: {"name": "Grace Hopper", "plan": "team", "since": 2021},
    9: {"name": "Katherine Johnson", "plan": "free", "since": 2024},
}


@attrs.frozen
class DemoOptions:
    """What the command line chose; the defaults are the README's demo.

    ``rate`` and ``burst`` are the ticket API's limits, both on the server and
    in fanout's configuration (its published limits); ``latency`` is the
    server's response time (with up to a third more of seeded jitter);
    ``faults`` is how many of the server's first requests answer 500;
    ``stream`` is how many seconds the model's message takes to arrive as a
    stream (None: it arrives whole).
    """

    calls: int = attrs.field(default=12, validator=attrs.validators.ge(1))
    rate: float = attrs.field(default=3.0, validator=attrs.validators.gt(0))
    burst: int = attrs.field(default=2, validator=attrs.validators.ge(1))
    latency: float = attrs.field(default=0.15, validator=attrs.validators.ge(0))
    policy: MutatingPolicy = "one"
    faults: int = attrs.field(default=1, validator=attrs.validators.ge(0))
    stream: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.gt(0))
    )


def plan_calls(n: int) -> list[ToolCall]:
    """The turn a support agent might emit: search, look things up, search again, write.

    With four or more calls: the search, ``n - 4`` lookups alternating
    between tickets and customers, the same search again, and two writes.
    """
    search = ("search_tickets", {"query": "refund"})
    lookups: list[tuple[str, dict[str, Any]]] = []
    for k in range(max(n - 4, 2)):
        if k % 2 == 0:
            lookups.append(("get_ticket", {"ticket_id": 101 + k // 2}))
        else:
            lookups.append(("get_customer", {"customer_id": 7 + k // 2}))
    if n < 4:
        chosen = [search, *lookups][:n]
    else:
        writes: list[tuple[str, dict[str, Any]]] = [
            ("add_comment", {"ticket_id": 101, "text": "Refund re-issued to the card on file."}),
            ("update_ticket", {"ticket_id": 101, "status": "pending"}),
        ]
        chosen = [search, *lookups[: n - 4], search, *writes]
    return [ToolCall(f"toolu_{i + 1:02d}", name, args) for i, (name, args) in enumerate(chosen)]


def build_tools(tickets: httpx.AsyncClient, crm: httpx.AsyncClient) -> Registry:
    """Five tools over two API keys; each makes one real HTTP request to the local server.

    Their answers come from fixed data, never from the server's response, so
    the transcript is the same on every run.
    """
    tools = Registry()

    async def request(client: httpx.AsyncClient, method: str, path: str, **kw: Any) -> None:
        response = await client.request(method, path, **kw)
        response.raise_for_status()  # 429/503/5xx were already raised by fanout's transport

    @tools.tool(kind=Kind.READS, scopes=["tickets"], timeout=10)
    async def search_tickets(query: str) -> dict[str, Any]:
        await request(tickets, "GET", "/tickets", params={"q": query})
        return {"query": query, "tickets": sorted(_TICKETS)}

    @tools.tool(kind=Kind.READS, scopes=["tickets"], timeout=10)
    async def get_ticket(ticket_id: int) -> dict[str, Any]:
        await request(tickets, "GET", f"/tickets/{ticket_id}")
        found = _TICKETS.get(ticket_id, {"subject": "(no subject)", "status": "closed"})
        return {"id": ticket_id, **found}

    @tools.tool(kind=Kind.READS, scopes=["crm"], timeout=10)
    async def get_customer(customer_id: int) -> dict[str, Any]:
        await request(crm, "GET", f"/customers/{customer_id}")
        found = _CUSTOMERS.get(customer_id, {"name": f"Customer {customer_id}", "plan": "free"})
        return {"id": customer_id, **found}

    @tools.tool(kind=Kind.MUTATING, scopes=["tickets"], timeout=10)
    async def add_comment(ticket_id: int, text: str) -> str:
        await request(tickets, "POST", f"/tickets/{ticket_id}/comments", json={"text": text})
        return f"comment added to ticket {ticket_id}"

    @tools.tool(kind=Kind.MUTATING, scopes=["tickets"], timeout=10)
    async def update_ticket(ticket_id: int, status: str) -> str:
        await request(tickets, "PATCH", f"/tickets/{ticket_id}", json={"status": status})
        return f"ticket {ticket_id} is now {status}"

    return tools


@attrs.frozen
class DemoOutcome:
    """Everything the demo learned: the turn, the server's record, the scopes' state."""

    options: DemoOptions
    url: str
    turn: Turn
    records: list[RequestRecord]
    learned_rate: float | None
    learned_burst: float
    message_ended: float | None = None  # --stream: when the message's last event arrived


@attrs.define
class StreamedMessage:
    """The model's message as Anthropic stream events, paced over ``seconds`` in-process.

    Block k (of n) is written from ``seconds·k/n`` to ``seconds·(k+1)/n``, its
    arguments in a few pieces; each watcher's ``on_model(time, written,
    total)`` hears when a block is complete and when the message ends.
    """

    calls: list[ToolCall]
    seconds: float
    watchers: tuple[Any, ...] = ()
    ended: float | None = None

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        began = trio.current_time()
        step = self.seconds / max(len(self.calls), 1)
        yield {"type": "message_start", "message": {"id": "msg_demo", "role": "assistant"}}
        for k, call in enumerate(self.calls):
            block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
            yield {"type": "content_block_start", "index": k, "content_block": block}
            text = json.dumps(_arguments(call))
            pieces = [text[i : i + 16] for i in range(0, len(text), 16)]
            for i, piece in enumerate(pieces):
                await trio.sleep_until(began + step * (k + i / len(pieces)))
                delta = {"type": "input_json_delta", "partial_json": piece}
                yield {"type": "content_block_delta", "index": k, "delta": delta}
            await trio.sleep_until(began + step * (k + 1))
            self._tell(k + 1)
            yield {"type": "content_block_stop", "index": k}
        yield {"type": "message_delta", "delta": {"stop_reason": "tool_use"}}
        self.ended = trio.current_time()
        self._tell(len(self.calls))
        yield {"type": "message_stop"}

    def _tell(self, written: int) -> None:
        for watcher in self.watchers:
            watcher.on_model(trio.current_time(), written, len(self.calls), self.ended is not None)


async def play(options: DemoOptions, *, instruments: tuple[Any, ...] = ()) -> DemoOutcome:
    """Start the server, run the turn through fanout, and gather what happened.

    With ``options.stream`` the turn reads the message as it streams in; the
    instruments that have an ``on_model`` method also hear its progress.
    """
    config = ServerConfig(
        keys={
            TICKETS_KEY: KeyLimits(options.rate, options.burst),
            CRM_KEY: KeyLimits(CRM_RATE, CRM_BURST),
        },
        latency=options.latency,
        jitter=options.latency / 3,
        seed=7,
        fail_first=options.faults,
    )
    async with serve_throttled(config) as server:
        tickets = http_client(base_url=server.url, headers={"x-api-key": TICKETS_KEY})
        crm = http_client(base_url=server.url, headers={"x-api-key": CRM_KEY})
        crm_scope = Scope("crm")  # no limits: learned from the server's headers
        runner = Runner(
            build_tools(tickets, crm),
            scopes=[Scope("tickets", rate=options.rate, burst=options.burst), crm_scope],
            mutating=options.policy,
            turn_timeout=30,
            rng=random.Random(0),
            instruments=instruments,
        )
        calls = plan_calls(options.calls)
        message = None
        async with tickets, crm:
            if options.stream is None:
                turn: Turn = await runner.run_turn(calls)
            else:
                watchers = tuple(i for i in instruments if hasattr(i, "on_model"))
                message = StreamedMessage(calls, options.stream, watchers)
                turn = await runner.run_stream(message.events(), AnthropicStream())
        bucket = crm_scope.statistics().bucket
        ended = message.ended if message is not None else None
        return DemoOutcome(
            options, server.url, turn, server.records, bucket.rate, bucket.burst, ended
        )


# -- the live display ------------------------------------------------------------


def describe(event: Event) -> str | None:
    """One event as a short phrase about its call, or None for events not worth a line."""
    kind, detail = event.kind, event.detail
    if kind is EventKind.QUEUED:
        return "queued"
    if kind is EventKind.COALESCED:
        return f"same call as {detail.get('leader')}: runs once, shares its answer"
    if kind is EventKind.CACHE_HIT:
        return "answered from the run's cache"
    if kind is EventKind.REPLAYED:
        return "same write as before: answered once, not run again"
    if kind is EventKind.TOKEN_WAIT:
        return f"waiting {event.wait or 0:.2f}s for a token on {event.scope}"
    if kind is EventKind.STARTED:
        return "running" if (event.attempt or 1) == 1 else f"running (attempt {event.attempt})"
    if kind is EventKind.REQUEST_SENT:
        parts = urlsplit(str(detail.get("url", "")))
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        return f"{detail.get('method')} {path}"
    if kind is EventKind.RESPONSE:
        text = f"<- {detail.get('status')}"
        if "retry_after" in detail:
            text += f", Retry-After {detail['retry_after']:g}s"
        if "limit" in detail and "window" in detail:
            text += f" (server states {detail['limit']:g} per {detail['window']:g}s"
            text += f", {detail['remaining']:g} left)" if "remaining" in detail else ")"
        return text
    if kind is EventKind.RETRY_SCHEDULED:
        return f"retrying in {event.wait or 0:.2f}s after {event.reason}"
    if kind is EventKind.SCOPE_BLOCKED:
        return f"scope {event.scope} paused {event.wait or 0:.2f}s at the server's request"
    if kind is EventKind.SHED:
        return f"shed: the queue on {event.scope} is full"
    if kind is EventKind.REFUSED:
        return "refused (see its answer below)"
    if kind is EventKind.ANSWERED:
        return f"answered {event.status.value if event.status else '?'}"
    return None


_ANSI = {
    "ok": "\x1b[32m",
    "bad": "\x1b[31m",
    "wait": "\x1b[33m",
    "dim": "\x1b[2m",
    "off": "\x1b[0m",
}


class LiveLines:
    """Plain output: one line per event, ``time  id  tool  what happened``."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.began: float | None = None

    def on_event(self, event: Event) -> None:
        if event.kind is EventKind.TURN_STARTED:
            self.began = event.time
        text = describe(event)
        if text is None or event.call_id is None:
            return
        since = event.time - (self.began if self.began is not None else event.time)
        self.out.write(f"  {since:5.2f}s  {event.call_id:<9} {event.tool or '':<15} {text}\n")
        self.out.flush()

    def on_model(self, time: float, written: int, total: int, ended: bool) -> None:
        """The streamed message's progress, as a line of its own."""
        since = time - (self.began if self.began is not None else time)
        text = "message complete" if ended else f"wrote call {written} of {total}, still writing"
        self.out.write(f"  {since:5.2f}s  {'(model)':<9} {'':<15} {text}\n")
        self.out.flush()


def milestone(event: Event) -> str | None:
    """One event as a word or two for the board's rows, or None to leave it out."""
    kind = event.kind
    if kind is EventKind.QUEUED:
        return "queued"
    if kind is EventKind.COALESCED:
        return f"same as {event.detail.get('leader')}"
    if kind is EventKind.TOKEN_WAIT:
        return f"token wait {event.wait or 0:.2f}s"
    if kind is EventKind.STARTED:
        return "running" if (event.attempt or 1) == 1 else f"attempt {event.attempt}"
    if kind is EventKind.RESPONSE:
        return str(event.detail.get("status"))
    if kind is EventKind.RETRY_SCHEDULED:
        return f"retry in {event.wait or 0:.2f}s"
    if kind in (EventKind.REFUSED, EventKind.SHED, EventKind.CACHE_HIT, EventKind.REPLAYED):
        return str(kind.value).replace("_", " ")
    if kind is EventKind.ANSWERED:
        return "answered" if event.status is None else str(event.status.value)
    return None


class LiveBoard:
    """On a terminal: one row per call with its life so far, redrawn in place,
    and a progress bar."""

    def __init__(self, out: TextIO, calls: list[ToolCall]) -> None:
        self.out = out
        self.calls = calls
        self.life: dict[str, list[str]] = {call.id: [] for call in calls}
        self.when = {call.id: "" for call in calls}
        self.colour = {call.id: "dim" for call in calls}
        self.answered: set[str] = set()
        self.drawn = 0
        self.began: float | None = None
        self.width = shutil.get_terminal_size((100, 24)).columns
        self.model: str | None = None  # --stream: how far the message has arrived

    def on_model(self, time: float, written: int, total: int, ended: bool) -> None:
        """The streamed message's progress, as the board's last line."""
        since = time - (self.began if self.began is not None else time)
        self.model = (
            f"message complete at {since:.2f}s"
            if ended
            else f"writing the message: {written} of {total} calls so far ({since:.2f}s)"
        )
        self.draw()

    def on_event(self, event: Event) -> None:
        if event.kind is EventKind.TURN_STARTED:
            self.began = event.time
        step = milestone(event)
        call_id = event.call_id
        if step is None or call_id is None or call_id not in self.life:
            return
        since = event.time - (self.began if self.began is not None else event.time)
        self.life[call_id].append(step)
        self.when[call_id] = f"{since:5.2f}s"
        self.colour[call_id] = _colour_for(event)
        if event.kind is EventKind.ANSWERED:
            self.answered.add(call_id)
        self.draw()

    def draw(self) -> None:
        lines = []
        for call in self.calls:
            head = f"  {call.id:<9} {call.name:<15} {self.when[call.id]:>6}  "
            life = " > ".join(self.life[call.id])
            room = max(self.width - len(head) - 1, 10)
            if len(life) > room:
                life = "..." + life[-(room - 3) :]
            colour = _ANSI[self.colour[call.id]]
            lines.append(f"{head}{colour}{life}{_ANSI['off']}")
        done, total, width = len(self.answered), len(self.calls), 30
        filled = round(width * done / max(total, 1))
        lines.append(f"  [{'#' * filled}{'.' * (width - filled)}] {done}/{total} answered")
        if self.model is not None:
            lines.append(f"  model: {self.model}")
        up = f"\x1b[{self.drawn}F" if self.drawn else ""
        self.out.write(up + "".join(f"\x1b[2K{line}\n" for line in lines))
        self.out.flush()
        self.drawn = len(lines)


def _colour_for(event: Event) -> str:
    if event.kind is EventKind.ANSWERED:
        return "ok" if event.status is Status.OK else "bad"
    if event.kind in (EventKind.TOKEN_WAIT, EventKind.RETRY_SCHEDULED, EventKind.SCOPE_BLOCKED):
        return "wait"
    if event.kind is EventKind.REFUSED:
        return "bad"
    return "dim" if event.kind is EventKind.QUEUED else "off"


# -- the summary -------------------------------------------------------------------


def summarise(outcome: DemoOutcome) -> dict[str, Any]:
    """What happened, from the trace, checked against the server's own record."""
    trace = outcome.turn.trace
    began = next(e.time for e in trace if e.kind is EventKind.TURN_STARTED)
    finished = next(e.time for e in trace if e.kind is EventKind.TURN_FINISHED)
    calls = outcome.turn.calls
    results = outcome.turn.results
    scope_of = {c.id: ("crm" if c.name == "get_customer" else "tickets") for c in calls}

    def of(kind: EventKind) -> list[Event]:
        return [e for e in trace if e.kind is kind]

    # A crm call held back by the probe is one whose admission (a token wait or
    # its start) came noticeably after it was queued.
    queued = {e.call_id: e.time for e in of(EventKind.QUEUED)}
    admitted: dict[str, float] = {}
    for e in trace:
        if e.kind in (EventKind.TOKEN_WAIT, EventKind.STARTED) and e.call_id is not None:
            admitted.setdefault(e.call_id, e.time)
    probe_held = [
        {"call_id": cid, "seconds": round(when - queued[cid], 3)}
        for cid, when in admitted.items()
        if scope_of.get(cid) == "crm" and when - queued[cid] > 0.005
    ]
    statuses = Counter(str(r.status) for r in outcome.records)
    summary: dict[str, Any] = {
        "elapsed_s": round(finished - began, 3),
        "calls": len(calls),
        "answered": len(results),
        "all_answered": sorted(r.tool_use_id for r in results) == sorted(c.id for c in calls),
        "results_by_status": dict(sorted(Counter(r.status.value for r in results).items())),
        "requests_sent": len(of(EventKind.REQUEST_SENT)),
        "server_requests": len(outcome.records),
        "server_statuses": dict(sorted(statuses.items())),
        "throttled_429": statuses.get("429", 0),
        "token_waits": [
            {"call_id": e.call_id, "scope": e.scope, "seconds": round(e.wait or 0, 3)}
            for e in of(EventKind.TOKEN_WAIT)
        ],
        "probe_waits": probe_held,
        "retries": [
            {"call_id": e.call_id, "after_s": round(e.wait or 0, 3), "reason": e.reason}
            for e in of(EventKind.RETRY_SCHEDULED)
        ],
        "coalesced": [
            {"call_id": e.call_id, "leader": e.detail.get("leader")}
            for e in of(EventKind.COALESCED)
        ],
        "refused": [{"call_id": e.call_id, "tool": e.tool} for e in of(EventKind.REFUSED)],
        "learned": {"scope": "crm", "rate": outcome.learned_rate, "burst": outcome.learned_burst},
    }
    if outcome.message_ended is not None:
        ended = outcome.message_ended
        first_start: dict[str, float] = {}
        for e in of(EventKind.STARTED):
            first_start.setdefault(e.call_id or "", e.time)
        summary["stream"] = {
            "message_ended_s": round(ended - began, 3),
            "started_while_arriving": [cid for cid, t in first_start.items() if t < ended],
            "answered_while_arriving": [
                e.call_id for e in of(EventKind.ANSWERED) if e.time < ended
            ],
        }
    return summary


def _summary_text(outcome: DemoOutcome, s: dict[str, Any]) -> list[str]:
    o = outcome.options
    by_status = ", ".join(f"{n} {status}" for status, n in s["results_by_status"].items())
    served = ", ".join(f"{code}: {n}" for code, n in s["server_statuses"].items())
    lines = [
        f"  {s['answered']} of {s['calls']} calls answered in {s['elapsed_s']:.2f}s ({by_status})",
        *_stream_text(s),
        f"  requests: {s['requests_sent']} sent by fanout, {s['server_requests']} in the "
        f"server's record ({served}); {s['throttled_429']} answered 429",
        "  waits, and why:",
    ]
    waits = [w for w in s["token_waits"] if w["scope"] == "tickets"]
    if waits:
        total = sum(w["seconds"] for w in waits)
        longest = max(w["seconds"] for w in waits)
        lines.append(
            f"    tickets: {len(waits)} waits for a token, {total:.2f}s in all (longest "
            f"{longest:.2f}s): the key allows {o.rate:g}/s with a burst of {o.burst}, so "
            "calls beyond the burst wait their turn here instead of earning 429s"
        )
    learned = s["learned"]
    if learned["rate"] is not None:
        held = s["probe_waits"]
        lines.append(
            f"    crm: fanout was told nothing about this key; it sent one call alone (the "
            f"probe) while {len(held)} waited, then read the server's headers: "
            f"{learned['rate']:g}/s, burst {learned['burst']:g}"
        )
        crm_waits = [w for w in s["token_waits"] if w["scope"] == "crm"]
        if crm_waits:
            lines.append(
                f"    crm: then {len(crm_waits)} waits for a token at the learned rate, "
                f"{sum(w['seconds'] for w in crm_waits):.2f}s in all"
            )
    for retry in s["retries"]:
        lines.append(
            f"    {retry['call_id']}: the server failed ({retry['reason']}); retried after "
            f"{retry['after_s']:.2f}s of full-jitter backoff"
        )
    for same in s["coalesced"]:
        lines.append(
            f"    {same['call_id']}: the same search as {same['leader']}: it ran once and "
            "both ids got its answer"
        )
    limited = [r for r in outcome.turn.results if r.status is Status.RATE_LIMITED]
    if limited:
        lines.append(
            f"    {len(limited)} calls answered rate_limited instead of waiting longer than "
            "fanout waits inline (2 s): each answer tells the model when to retry "
            "(retry_after_ms)"
        )
    for refused in s["refused"]:
        lines.append(
            f"    {refused['call_id']} ({refused['tool']}): refused, not run: policy "
            f"'{o.policy}' runs one write per turn (--policy serial runs both, in order)"
        )
    return lines


def _stream_text(s: dict[str, Any]) -> list[str]:
    """--stream: how much of the turn overlapped the message's arrival."""
    if "stream" not in s:
        return []
    streamed = s["stream"]
    return [
        f"  the message took {streamed['message_ended_s']:.2f}s to arrive: "
        f"{len(streamed['started_while_arriving'])} calls started and "
        f"{len(streamed['answered_while_arriving'])} were answered before it ended "
        "(each read starts the moment its block is complete; writes wait for the end)"
    ]


def render_text(outcome: DemoOutcome, out: TextIO) -> None:
    """The message to the model, pretty-printed, and the summary."""
    message = anthropic_tool_results(outcome.turn)
    out.write("\nThe message that goes back to the model (fanout.anthropic_tool_results):\n\n")
    out.write(json.dumps(message, indent=2, ensure_ascii=False) + "\n")
    out.write("\nSummary\n")
    for line in _summary_text(outcome, summarise(outcome)):
        out.write(line + "\n")


def render_json(outcome: DemoOutcome) -> dict[str, Any]:
    """One machine-readable document: calls, results, the message, the trace, the summary."""
    turn = outcome.turn
    began = next(e.time for e in turn.trace if e.kind is EventKind.TURN_STARTED)
    return {
        "options": attrs.asdict(outcome.options),
        "server": {
            "url": outcome.url,
            "tickets": {"rate": outcome.options.rate, "burst": outcome.options.burst},
            "crm": {"rate": CRM_RATE, "burst": CRM_BURST},
        },
        "calls": [{"id": c.id, "name": c.name, "arguments": _arguments(c)} for c in turn.calls],
        "results": [
            {
                "tool_use_id": r.tool_use_id,
                "status": r.status.value,
                "content": r.content,
                "retry_after_ms": r.retry_after_ms,
                "scope": r.scope,
            }
            for r in turn.results
        ],
        "message": anthropic_tool_results(turn),
        "events": [_event_json(e, began) for e in turn.trace],
        "summary": summarise(outcome),
    }


def _arguments(call: ToolCall) -> dict[str, Any]:
    return dict(call.arguments) if isinstance(call.arguments, Mapping) else {}


def _event_json(event: Event, began: float) -> dict[str, Any]:
    data: dict[str, Any] = {"t": round(event.time - began, 4), "kind": event.kind.value}
    for name in ("call_id", "tool", "scope", "attempt", "wait", "reason"):
        value = getattr(event, name)
        if value is not None:
            data[name] = value
    if event.status is not None:
        data["status"] = event.status.value
    if event.detail:
        data["detail"] = dict(event.detail)
    return data


def _faults(options: DemoOptions) -> str:
    if options.faults == 0:
        return "no injected faults"
    if options.faults == 1:
        return "the server's first request answers 500 (a transient fault, to show a retry)"
    return f"the server's first {options.faults} requests answer 500 (transient faults)"


def _header(options: DemoOptions, calls: list[ToolCall]) -> list[str]:
    lines = [
        "fanout demo: one agent turn against a throttled API on 127.0.0.1",
        "",
        f"  tickets API: {options.rate:g} requests/s, burst {options.burst}: fanout is "
        "configured with these limits",
        f"  crm API:     {CRM_RATE:g} requests/s, burst {CRM_BURST}: fanout is told nothing "
        "and learns them from the headers",
        f"  latency {options.latency * 1000:g} ms (+ up to a third more); {_faults(options)}; "
        f"write policy '{options.policy}'",
        "",
        "The model asked for:"
        if options.stream is None
        else f"The model asks for (its message streams in over {options.stream:g}s; each call "
        "starts the moment its block is complete):",
    ]
    for call in calls:
        args = ", ".join(f"{k}={v!r}" for k, v in _arguments(call).items())
        lines.append(f"  {call.id:<9} {call.name}({args})")
    lines += ["", "Live:"]
    return lines


def run_demo(options: DemoOptions, *, as_json: bool = False, out: TextIO | None = None) -> int:
    """Play the demo and print it; returns the exit status (0)."""
    stream = out if out is not None else sys.stdout
    calls = plan_calls(options.calls)
    instruments: tuple[Any, ...] = ()
    if not as_json:
        for line in _header(options, calls):
            stream.write(line + "\n")
        fancy = (
            stream.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"
        )
        instruments = (LiveBoard(stream, calls) if fancy else LiveLines(stream),)
    outcome = trio.run(lambda: play(options, instruments=instruments))
    if as_json:
        stream.write(json.dumps(render_json(outcome), indent=2, ensure_ascii=False) + "\n")
    else:
        render_text(outcome, stream)
    stream.flush()
    return 0
