"""Redis URLs and key names, checked without a server: what reaches coredis, and which slot."""

from __future__ import annotations

import coredis
import pytest
from coredis._utils import hash_slot
from hypothesis import given, settings
from hypothesis import strategies as st

from fanout import ConfigurationError
from fanout._redact import redact_text
from fanout._redis_client import client_from_url
from fanout._redis_keys import scope_key_base
from fanout.redis import RedisIdempotencyStore, RedisScope

SUFFIXES = (":bucket", ":exhausted", ":leases")
# Text rich in the characters that decide a hash tag.
braced = st.text(st.sampled_from("{}:ab\u00e9\U0001f600"), max_size=8) | st.text(max_size=12)


def slot(key: str) -> int:
    return hash_slot(key.encode())


def refused(prefix: str) -> bool:
    first = prefix.find("{")
    return first >= 0 and prefix[first + 1 : first + 2] == "}"


@settings(max_examples=500)
@given(braced, braced.filter(bool))
def test_every_key_of_a_scope_hashes_to_one_slot(prefix: str, name: str) -> None:
    """Whatever the prefix and the name, a scope's keys share one cluster slot (or are refused)."""
    if refused(prefix):
        with pytest.raises(ConfigurationError, match="Redis Cluster slots"):
            scope_key_base(prefix, name)
        return
    base = scope_key_base(prefix, name)
    assert len({slot(base + suffix) for suffix in SUFFIXES}) == 1


@settings(max_examples=500)
@given(braced.filter(lambda p: not refused(p)), braced.filter(bool), braced.filter(bool))
def test_two_scope_names_never_share_keys(prefix: str, one: str, other: str) -> None:
    """Distinct names give distinct keys, also when one is tagged by a hash."""
    keys = [{scope_key_base(prefix, name) + suffix for suffix in SUFFIXES} for name in (one, other)]
    assert (keys[0] == keys[1]) == (one == other)
    assert not keys[0] & keys[1] or one == other


def test_a_brace_free_name_is_its_own_hash_tag() -> None:
    """Plain names keep the readable key layout: ``<prefix>{<name>}``."""
    assert scope_key_base("fanout:", "ticket-api") == "fanout:{ticket-api}"


@pytest.mark.parametrize(
    ("url", "cluster", "kind"),
    [
        ("redis://127.0.0.1:6379/0", False, coredis.Redis),
        ("rediss://user:secret@redis.example:6380/2", False, coredis.Redis),
        ("unix:///run/redis.sock", False, coredis.Redis),
        ("redis://127.0.0.1:7000", True, coredis.RedisCluster),
        ("rediss://clustercfg.example:6379/0", True, coredis.RedisCluster),
    ],
)
def test_each_connection_form_makes_its_client(url: str, cluster: bool, kind: type) -> None:
    """redis://, rediss:// and unix:// name one server; cluster=True a cluster's startup node."""
    assert isinstance(client_from_url(url, cluster=cluster), kind)


@pytest.mark.parametrize(
    ("url", "cluster", "words"),
    [
        ("http://127.0.0.1:6379", False, "must start with redis://, rediss://, unix://"),
        ("127.0.0.1:6379", False, "must start with"),
        ("redis://127.0.0.1:port/0", False, "port that is not a number"),
        ("redis:///0", False, "must name a host"),
        ("unix:///run/redis.sock", True, "must start with redis://, rediss://;"),
        ("redis://127.0.0.1:7000/1", True, "only database 0"),
        ("redis://127.0.0.1:7000?db=2", True, "only database 0"),
        ("rediss://127.0.0.1:6380/0?ssl_ca_certs=/no/such/ca.pem", False, "options that cannot"),
        ("rediss://127.0.0.1:6380/0?ssl_cert_reqs=sometimes", True, "options that cannot"),
        # Port 0 was read as no port, and 6379 used; numbers were taken for 'abc'.
        ("redis://127.0.0.1:0/0", False, "no usable port"),
        ("redis://127.0.0.1:6379/0?socket_timeout=abc", False, "socket_timeout='abc', not a"),
        ("redis://127.0.0.1:6379/0?max_connections=-1", True, "max_connections='-1', not a"),
        ("redis://127.0.0.1:6379/0?protocol_version=9", False, "protocol_version='9', not 2"),
    ],
)
def test_a_url_fanout_cannot_use_is_refused_at_once(url: str, cluster: bool, words: str) -> None:
    """A wrong URL is a ConfigurationError when the scope or store is built, not a late failure."""
    with pytest.raises(ConfigurationError, match=words):
        RedisScope.from_url(url, name="api", cluster=cluster)
    with pytest.raises(ConfigurationError, match=words):
        RedisIdempotencyStore.from_url(url, cluster=cluster)


@pytest.mark.parametrize("cluster", [False, True])
def test_a_refused_url_never_shows_its_password(cluster: bool) -> None:
    """Error messages name the URL with its password replaced, since they end up in logs."""
    with pytest.raises(ConfigurationError) as refused:
        client_from_url("redis://app:hunter2@127.0.0.1:port", cluster=cluster)
    assert "hunter2" not in str(refused.value)
    assert "redis://app:***@127.0.0.1:port" in str(refused.value)
    # A user alone may be the password itself (a provider's token as the user).
    with pytest.raises(ConfigurationError) as refused:
        client_from_url("redis://Sx9kL2qZ7tR4vX8m@127.0.0.1:port", cluster=cluster)
    assert "Sx9kL2qZ7tR4vX8m" not in str(refused.value)
    assert "redis://***@127.0.0.1:port" in str(refused.value)


@given(
    # Distinctive: a URL fanout accepts teaches it the password as a secret for the rest
    # of the process, and "000000" would then be scrubbed from every later test's text.
    password=st.text(st.characters(codec="ascii", exclude_characters="@"), min_size=4).map(
        lambda rest: f"pw-q7Zx{rest}"
    ),
    user=st.sampled_from(["", "app"]),
    rest=st.sampled_from(["127.0.0.1:6379/0", "127.0.0.1:port", "h:1/x?db=a", "", "h/0"]),
    scheme=st.sampled_from(["redis", "rediss", "http"]),
    cluster=st.booleans(),
)
def test_no_refused_url_shows_its_password_whatever_it_holds(
    password: str, user: str, rest: str, scheme: str, cluster: bool
) -> None:
    """A password holding an unencoded '/', '?' or '#' ended the part ``urlsplit``
    takes for the host early: it found no password to hide, and the message refusing
    the URL quoted it whole. Whatever the password holds, it is never shown."""
    url = f"{scheme}://{user}:{password}@{rest}"
    message = ""
    try:
        client_from_url(url, cluster=cluster)
    except ConfigurationError as refused:
        message = str(refused)
    assert password not in message


@pytest.mark.parametrize(
    ("query", "checks_the_name"),
    [("", True), ("?ssl_check_hostname=false", False), ("?ssl_cert_reqs=none", False)],
)
def test_rediss_checks_the_certificate_name_unless_told_not_to(
    query: str, checks_the_name: bool
) -> None:
    """The TLS context fanout makes verifies the host name by default; the URL can say otherwise."""
    client = client_from_url(f"rediss://redis.example:6380/0{query}")
    assert isinstance(client, coredis.Redis)
    context = client.connection_pool.connection_kwargs["ssl_context"]
    assert context is not None
    assert context.check_hostname is checks_the_name


def test_a_redis_password_is_scrubbed_wherever_it_is_quoted() -> None:
    """The password a scope or store connects with is a credential fanout was given: a
    tool's answer that quotes it bare (a connection string in its error) shows none of
    it, as one the HTTP layer saw sent shows none."""
    client_from_url("redis://app:pw-7d2c9e4a1f@127.0.0.1:6379/0")
    client_from_url("redis://127.0.0.1:6379/0?password=pw-3b8f1a6c0e")
    for password in ("pw-7d2c9e4a1f", "pw-3b8f1a6c0e"):
        assert password not in redact_text(f"could not log in with {password}")
