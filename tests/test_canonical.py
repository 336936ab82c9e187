"""Canonical JSON: one spelling for equal values, and a spelling for values JSON lacks."""

from __future__ import annotations

import json
import math

from hypothesis import given
from hypothesis import strategies as st

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


_KEYS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(["1", "null", "true", "a"]),
    st.tuples(st.integers(0, 2)), st.floats(-2, 2, allow_nan=False),
)  # fmt: skip


@given(mapping=st.dictionaries(_KEYS, st.uuids().map(str), max_size=8))
def test_no_value_of_a_mapping_is_lost_however_its_keys_are_spelled(
    mapping: dict[object, str],
) -> None:
    """Keys of mixed types that JSON writes alike (``1`` and ``"1"``, ``None`` and
    ``"null"``) keep every value: as an object, one of them was dropped."""
    spelled = canonical_json(mapping)
    written = json.loads(spelled)
    for value in mapping.values():
        assert value in spelled
    if isinstance(written, dict):
        assert len(written) == len(mapping)
    else:  # [key, value] pairs
        assert sorted(v for _, v in written) == sorted(mapping.values())
    assert canonical_json(dict(reversed(mapping.items()))) == spelled
