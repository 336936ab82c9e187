"""Canonical JSON: one spelling for equal values, and a spelling for values JSON lacks."""

from __future__ import annotations

import math

from fanout.idempotency import canonical_json, idempotency_key


def test_non_finite_numbers_are_spelled_as_strings_json_can_carry() -> None:
    """inf, -inf and NaN are "Infinity", "-Infinity" and "NaN", never invalid JSON."""
    spelled = canonical_json({"b": -math.inf, "a": math.inf, "c": math.nan})
    assert spelled == '{"a":"Infinity","b":"-Infinity","c":"NaN"}'


def test_equal_arguments_in_any_order_share_one_idempotency_key() -> None:
    """Key order does not change a write's key; the same write in another run has another."""
    one = idempotency_key("run", "send", {"to": "a", "n": 1})
    assert one == idempotency_key("run", "send", {"n": 1, "to": "a"})
    assert one != idempotency_key("other run", "send", {"to": "a", "n": 1})
    assert len(one) == 64


def test_arguments_that_contain_themselves_get_a_key_of_their_own() -> None:
    """Two self-containing argument objects, alike in shape, are never taken for one write."""
    first: dict[str, object] = {"to": "a"}
    first["self"] = first
    second: dict[str, object] = {"to": "a"}
    second["self"] = second
    key = idempotency_key("run", "send", first)
    assert key == idempotency_key("run", "send", first)
    assert key != idempotency_key("run", "send", second)
    assert len(key) == 64
