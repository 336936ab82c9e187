"""fanout's HTTP edge, in full: the transport, its signal, and the header reader.

``fanout.FanoutTransport`` and ``fanout.http_client`` are all most code
needs (they are here too). The rest is for tools that speak HTTP some other
way: ``NotSentError``, which the transport raises inside a tool when a
request's wait does not fit its budget, and ``parse_rate_limit_headers``,
which reads any dialect of rate-limit headers into a ``RateLimitInfo``.
"""

from ._exceptions import NotSentError as NotSentError
from ._headers import parse_rate_limit_headers as parse_rate_limit_headers
from ._http import FanoutTransport as FanoutTransport
from ._http import http_client as http_client
from ._values import RateLimitInfo as RateLimitInfo

__all__ = [
    "FanoutTransport",
    "NotSentError",
    "RateLimitInfo",
    "http_client",
    "parse_rate_limit_headers",
]
