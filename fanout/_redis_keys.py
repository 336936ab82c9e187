"""Key names that keep each scope's keys in one Redis Cluster hash slot.

A cluster runs a Lua script only when all the keys it names hash to one slot.
A key's slot is computed from its *hash tag*, the text between its first
``{`` and the next ``}``, when that text is not empty; otherwise from the
whole key. A scope's keys are ``<prefix>{<tag>}:bucket``, ``:exhausted`` and
``:leases``, so they share a slot exactly when the tag is decided before the
suffix. The tag is the scope's name; a name with a brace in it (which could
empty the tag or end it early) is tagged by its SHA-1 instead, and follows
the tag, so it cannot share keys with a scope named by that hex. Braces in the
prefix make a tag of their own (every scope then shares one slot, on one
node); only a prefix whose first ``{`` is followed at once by ``}`` would let
the keys drift apart, so it is refused.
"""

from __future__ import annotations

import hashlib

from ._exceptions import ConfigurationError

__all__ = ["scope_key_base"]


def scope_key_base(prefix: str, name: str) -> str:
    """``<prefix>{<tag>}``, which every key of the scope ``name`` starts with."""
    first = prefix.find("{")
    if first >= 0 and prefix.startswith("}", first + 1):
        raise ConfigurationError(
            f"a Redis key prefix whose first '{{' is followed by '}}' ({prefix!r}) would spread "
            "a scope's keys over Redis Cluster slots; drop the empty braces"
        )
    if "{" not in name and "}" not in name:
        return f"{prefix}{{{name}}}"
    return f"{prefix}{{{hashlib.sha1(name.encode()).hexdigest()}}}{name}"
