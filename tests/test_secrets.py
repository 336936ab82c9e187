"""Known secrets: scrubbed in every spelling, too-short ones left alone, the oldest forgotten."""

from __future__ import annotations

from fanout import Secret
from fanout._secrets import REDACTED, SecretRegistry, scrub_secrets


def test_a_value_shorter_than_four_characters_is_never_scrubbed() -> None:
    """Scrubbing 'abc' would redact ordinary words; a secret that short is left alone."""
    assert scrub_secrets("abc and abcd", ["abc"]) == "abc and abcd"
    assert scrub_secrets("abc and abcd", ["abcd"]) == f"abc and {REDACTED}"


def test_a_bounded_registry_forgets_its_oldest_secret_and_shows_none() -> None:
    """Past its limit the least recently learned secret goes; its repr counts, never shows."""
    # A registry of its own: filling the process's one would evict the secrets
    # other tests registered.
    known = SecretRegistry(limit=2)
    one, two, three = Secret("first-key"), Secret("second-key"), Secret("third-key")
    known.learn([one, two])
    known.learn([one])  # learned again: now the newest
    known.learn([three])
    assert known.values() == ["first-key", "third-key"]
    assert known.unknown([one, two, three]) == [two]
    assert repr(known) == "<known secrets: 2>"
    pattern = known.pattern()
    assert pattern is not None
    assert pattern.sub(REDACTED, "first-key second-key third-key") == (
        f"{REDACTED} second-key {REDACTED}"
    )
