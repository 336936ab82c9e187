"""The HTTP library's own log, scrubbed of the credentials fanout has seen sent.

httpx (and httpx2) log every request at INFO in a logger of their own,
``HTTP Request: GET <url> "HTTP/1.1 200 OK"``, the query string included:
a key passed as ``?api_key=`` reached any log handler a user had set up at
INFO, though every answer, event and log line of fanout's was scrubbed.
A transport puts a filter on that logger which replaces, in each record,
the secrets this process has learned (`fanout._secrets`). It runs only for
records the logger's level lets through, and changes nothing else.
"""

from __future__ import annotations

import logging

from ._secrets import scrub_secrets

__all__ = ["scrub_library_log"]


class _Scrubbed(logging.Filter):
    """Rewrites a record whose message holds a learned secret; lets every record through."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record logging cannot format: logging reports it itself
            return True
        scrubbed = scrub_secrets(message)
        if scrubbed != message:
            record.msg, record.args = scrubbed, None
        return True


_FILTER = _Scrubbed()


def scrub_library_log(name: str) -> None:
    """Scrub the logger ``name`` (the library's own) from now on; once however often asked."""
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
