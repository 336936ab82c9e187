"""Canonical text: one spelling for equal values, whatever a tool hands back.

The transcript must be byte-identical for the same outcomes (invariant 4), so
anything we turn into text for the model is serialised with sorted keys and
compact separators. And a tool's output is the one thing fanout cannot
choose: dicts with keys of mixed types, tuples as keys, objects whose
``__str__`` raises, NaN, lone surrogates, structures thousands of levels deep.
None of that may cost a call its answer, so the value is first rewritten into
plain JSON data by rules that cannot fail, then written by ``json``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from ._redact import redact_text

__all__ = [
    "SHORTEST_CAP",
    "canonical_arguments",
    "canonical_json",
    "idempotency_key",
    "key_of_spelled",
    "safe_text",
    "shown",
    "truncate",
    "truncation_marker",
    "uncut",
]

MAX_DEPTH = 200
"""Levels of nesting fanout reads or writes; deeper values are no use to a model or a tool,
and serialising them would exhaust Python's recursion limit."""


class NotSerialisableError(ValueError):
    """A value contains itself, or nests deeper than ``MAX_DEPTH``."""


def safe_text(value: object) -> str:
    """``str(value)`` for a value fanout did not make, never raising.

    Falls back to ``repr``, then to the type's name: an exception whose
    ``__str__`` raises still gets described. Lone surrogates, which no
    UTF-8 request to a model could carry, become U+FFFD.
    """
    for render in (str, repr):
        try:
            return clean_text(render(value))
        except KeyboardInterrupt:
            raise
        except BaseException:  # a ``SystemExit`` from a ``__str__`` is its failure to print
            continue
    return f"<unprintable {type(value).__name__}>"


def shown(value: object) -> str:
    """A short, safe rendering of a hostile value for an error message: no credential in
    it (a model's call id that was a key went into `InvalidTurnError` whole)."""
    try:
        text = redact_text(repr(value))
    except KeyboardInterrupt:
        raise
    except BaseException:  # a __repr__ that raises, or nesting too deep to render
        return f"a {type(value).__name__}"
    return text if len(text) <= 80 else text[:77] + "..."


def clean_text(text: str) -> str:
    """``text`` as valid Unicode: any lone surrogate replaced by U+FFFD."""
    if text.isascii():  # no surrogate, and asked without encoding the text
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def _plain(value: Any, path: set[int], depth: int) -> Any:
    """``value`` as JSON data: str keys, lists, finite numbers, text for the rest."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return clean_text(str.__str__(value))
    if isinstance(value, int):
        return _integer(value)
    if isinstance(value, float):
        number = float.__float__(value)  # a subclass's own ``__float__`` may raise
        if math.isfinite(number):
            return number
        return "NaN" if math.isnan(number) else ("Infinity" if number > 0 else "-Infinity")
    if depth >= MAX_DEPTH:
        raise NotSerialisableError(f"the value nests deeper than {MAX_DEPTH} levels")
    container = isinstance(value, Mapping | list | tuple | set | frozenset)
    if container:
        if id(value) in path:
            raise NotSerialisableError("the value contains itself")
        path.add(id(value))
    try:
        if isinstance(value, Mapping):
            return _plain_mapping(value, path, depth)
        if isinstance(value, list | tuple):
            return [_plain(item, path, depth + 1) for item in value]
        if isinstance(value, set | frozenset):
            items = [_plain(item, path, depth + 1) for item in value]
            return sorted(items, key=_spelling)
    except NotSerialisableError:
        raise
    except Exception:
        # A container that cannot be read (a mapping whose ``items`` raises, a list
        # whose ``__iter__`` does) is written by its text, as any other object.
        pass
    finally:
        if container:
            path.discard(id(value))
    return safe_text(value)


_DIGITS_AT_ONCE = 1000  # digits of a long int turned into text per step
_LONGEST_INT = 1_000_000  # digits; a longer int is written by its size alone


def _integer(value: int) -> int | str:
    """An int as JSON data: itself; or, past the digits Python turns into text at once
    (``sys.get_int_max_str_digits``, 4300 by default), the string of its digits.

    Past that limit ``json`` refuses it. A power-of-ten division makes the
    digits a thousand at a time, and the answer's size cap cuts them; an int of
    more than a million digits is written by its size, not spelt.
    """
    number = int.__int__(value)  # a subclass's own ``__int__`` may raise
    try:
        str(number)
    except ValueError:
        pass
    else:
        return number
    sign, rest = ("-", -number) if number < 0 else ("", number)
    if rest.bit_length() > _LONGEST_INT * 3.33:
        return f"{sign}<an integer of {rest.bit_length()} bits>"
    chunks: list[int] = []
    step = 10**_DIGITS_AT_ONCE
    while rest:
        rest, chunk = divmod(rest, step)
        chunks.append(chunk)
    head, *tail = reversed(chunks)
    return sign + str(head) + "".join(f"{chunk:0{_DIGITS_AT_ONCE}d}" for chunk in tail)


def _plain_mapping(
    value: Mapping[Any, Any], path: set[int], depth: int
) -> dict[str, Any] | list[list[Any]]:
    """Keys spelled as json would (1 -> "1", None -> "null"), anything else by its text,
    in an order that never depends on insertion.

    Where two keys spell alike (``1`` and ``"1"``, ``None`` and ``"null"``), an object
    would keep one of them: the mapping is written as its ``[key, value]`` pairs
    instead, each key as JSON data, so that nothing the tool returned is lost. (Kept
    as an object, the first in order stood and the other value was dropped.)
    """
    entries = sorted(
        ((_key(k), type(k).__name__, k, _plain(v, path, depth + 1)) for k, v in value.items()),
        key=lambda entry: (entry[0], entry[1], _spelling(entry[3])),
    )
    plain = {key: item for key, _, _, item in entries}
    if len(plain) == len(entries):
        return plain
    return [[_plain(key, path, depth + 1), item] for _, _, key, item in entries]


def _key(key: Any) -> str:
    if isinstance(key, str):
        return clean_text(str.__str__(key))
    if isinstance(key, int) and not isinstance(key, bool):
        return str(_integer(key))  # digits, as json spells an int key
    if key is None or isinstance(key, bool | float):
        return _spelling(_plain(key, set(), 0))
    return safe_text(key)


def _spelling(plain: Any) -> str:
    return json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# One encoder for every call: ``json.dumps`` with options builds a new one each time,
# and even a kept ``JSONEncoder`` builds its C encoder on every ``encode``, which
# costs more than encoding a tool's usual arguments. The C encoder is kept instead:
# without a table of the containers it is in (``markers=None``), it keeps no state
# between calls and may serve every thread; a value that contains itself then
# recurses into a ``RecursionError``, which takes the careful rewrite as the
# circular-reference error did. Without the C accelerator, the kept encoder does.
_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
_MAKE_C_ENCODER = getattr(json.encoder, "c_make_encoder", None)  # not in the stubs
_C_ENCODER = (
    None
    if _MAKE_C_ENCODER is None
    else _MAKE_C_ENCODER(
        None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", True, False, False
    )
)


def _encode(value: Any) -> str:
    """``value`` as compact JSON with sorted keys; raises what ``json`` raises."""
    if _C_ENCODER is None:
        return _ENCODER.encode(value)
    return "".join(_C_ENCODER(value, 0))


def canonical_json(value: Any) -> str:
    """Serialise ``value`` with sorted keys and no insignificant whitespace.

    Always valid JSON. Keys that are not strings are written as JSON would
    write them, or by their text; values JSON cannot represent are written
    as their text (a ``datetime``, an object), NaN and infinities as the
    strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``, an int too long for
    Python to print at once as the string of its digits. Raises
    ``ValueError`` only for a value that contains itself or nests deeper
    than ``MAX_DEPTH``.

    Plain JSON data (the usual case) is written by ``json`` directly; only
    a value ``json`` refuses takes the slower, careful rewrite. Either way
    the same value always takes the same path, so its spelling is stable.
    """
    try:
        text = _encode(value)
    except Exception:  # refused, or an object that raised as ``json`` read it
        return _spelling(_plain(value, set(), 0))
    return clean_text(text)


# Characters: the least ``max_output_chars``. A cut answer carries what says it was cut
# (the marker, or JSON's envelope with its count), 52 characters and the count's digits:
# a shorter cap could not be kept to, and was not (a cap of 20 gave 55-character answers).
SHORTEST_CAP = 64


def truncation_marker(dropped: int) -> str:
    """The visible mark of a cut: how many characters were dropped."""
    return f"\n[truncated by fanout: {dropped} more characters]"


def truncate(text: str, limit: int, *, total: int | None = None) -> str:
    """Cut ``text`` to at most ``limit`` characters, saying how much was dropped.

    The marker counts against the cap (sized for the largest count it could
    carry), so a cut text is never longer than ``limit`` unless the cap is
    shorter than the marker itself. ``total`` is the length of the text that
    ``text`` begins, when it is the head of a longer one cut before: the
    marker counts what that one dropped.
    """
    total = len(text) if total is None else total
    if total <= limit:
        return text
    keep = max(0, limit - len(truncation_marker(total)))
    return text[:keep] + truncation_marker(total - keep)


# `truncation_marker`, at the end of a text, its count read back.
_MARKED = re.compile(r"\n\[truncated by fanout: (\d+) more characters\]\Z")


def uncut(text: str) -> tuple[str, int]:
    """What `truncate` kept of a text, and how long the text was: ``text`` and its own
    length when it was never cut."""
    marked = _MARKED.search(text)
    if marked is None:
        return text, len(text)
    kept = text[: marked.start()]
    return kept, len(kept) + int(marked[1])


def idempotency_key(run_id: str, tool: str, arguments: Any) -> str:
    """sha256 over the run, the tool and the canonical arguments.

    Equal calls in one run share a key however the model ordered or spaced
    their arguments, so a retried or re-issued write is recognisable as the
    same write, here and downstream. Arguments with no canonical form (they
    contain themselves) get a key of their own: such a call is never taken
    for another one.
    """
    return key_of_spelled(run_id, tool, canonical_arguments(arguments))


def canonical_arguments(arguments: Any) -> str:
    """The arguments' canonical JSON, or a spelling of their own when they have none."""
    try:
        return canonical_json(arguments)
    except ValueError:
        return f"\x00uncanonical:{id(arguments)}"


def key_of_spelled(run_id: str, tool: str, spelled: str) -> str:
    """`idempotency_key`, for arguments already spelled by `canonical_arguments`."""
    material = "\x00".join((clean_text(run_id), clean_text(tool), spelled))
    return hashlib.sha256(material.encode()).hexdigest()
