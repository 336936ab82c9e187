"""A library's own log (the HTTP library's, the MCP client's, fanout's), scrubbed of the
credentials fanout has seen sent.

httpx (and httpx2) log every request at INFO in a logger of their own,
``HTTP Request: GET <url> "HTTP/1.1 200 OK"``, the query string included:
a key passed as ``?api_key=`` reached any log handler a user had set up at
INFO, though every answer, event and log line of fanout's was scrubbed.
Their connection pools (httpcore) log every header at DEBUG, which a
server may echo a key in. A transport puts a filter on those loggers which
replaces, in each record, the secrets this process has learned
(`fanout._secrets`) and credentials by their shape (`fanout._redact`): a
key the registry had let go (it keeps 256) while its request was out was
logged as sent. It runs only for records the logger's level lets through,
and changes nothing else.
"""

from __future__ import annotations

import logging

from ._redact import redact_text

__all__ = ["scrub_library_log"]


class _Scrubbed(logging.Filter):
    """Rewrites a record whose message, traceback or stack holds a credential; lets every
    record through.

    A traceback is written out here, scrubbed, as the record's text, and its exception
    dropped: the MCP client logs a failed stream with its traceback, whose
    ``HTTPStatusError`` names the URL, ``?api_key=`` and all, and a handler writes a
    traceback from the exception itself.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record logging cannot format: logging reports it itself
            return True
        scrubbed = redact_text(message)
        if scrubbed != message:
            record.msg, record.args = scrubbed, None
        if record.exc_info and not record.exc_text:
            try:
                record.exc_text = _FORMATTER.formatException(record.exc_info)
            except Exception:  # an exception whose traceback cannot be written
                record.exc_text = "(a traceback that could not be written)"
        record.exc_info = None
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info)
        return True


_FORMATTER = logging.Formatter()


_FILTER = _Scrubbed()


def scrub_library_log(name: str) -> None:
    """Scrub the logger ``name`` (the library's own) from now on; once however often asked."""
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
