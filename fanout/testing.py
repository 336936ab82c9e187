"""Tools for testing code built on fanout: a throttling HTTP server on 127.0.0.1.

Run it in the same ``trio.run`` as the code under test, under
``trio.testing.MockClock(autojump_threshold=0)``, and its timing is virtual and
exact::

    async with serve_throttled(ServerConfig(rate=4, burst=2)) as server:
        ...  # point a client at server.url, then assert on server.records
"""

from ._throttle_server import HeaderStyle as HeaderStyle
from ._throttle_server import KeyLimits as KeyLimits
from ._throttle_server import Model as Model
from ._throttle_server import RequestRecord as RequestRecord
from ._throttle_server import ResetMeaning as ResetMeaning
from ._throttle_server import ResetRounding as ResetRounding
from ._throttle_server import RetryAfterFormat as RetryAfterFormat
from ._throttle_server import ServerConfig as ServerConfig
from ._throttle_server import ThrottlingServer as ThrottlingServer
from ._throttle_server import serve_throttled as serve_throttled

__all__ = [
    "HeaderStyle",
    "KeyLimits",
    "Model",
    "RequestRecord",
    "ResetMeaning",
    "ResetRounding",
    "RetryAfterFormat",
    "ServerConfig",
    "ThrottlingServer",
    "serve_throttled",
]
