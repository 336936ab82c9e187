"""Logging a failure, without the logging failing in turn.

fanout logs what it answers for a tool, an instrument or a part plugged in
that failed, with the traceback. Writing a traceback calls into the failed
objects (an exception's ``__str__``, its ``__cause__``'s, its ``__bool__``),
and logging, finding those raise, prints the error to stderr and can raise
it again: an instrument's exception whose ``__bool__`` raised went out of
``run()`` as a ``TypeError``, every call answered "the caller cancelled".
"""

from __future__ import annotations

import logging

from ._library_log import scrub_library_log

__all__ = ["log_failure"]

# fanout's own loggers are scrubbed as the libraries' are: a failed part's traceback
# names what it was doing (an exporter's URL with its ``?api_key=``, a store's DSN
# with its password), and was written out whole.
for _name in ("fanout", "fanout.redis"):
    scrub_library_log(_name)


def log_failure(
    logger: logging.Logger,
    message: str,
    *args: object,
    exc: BaseException,
    level: int = logging.ERROR,
) -> None:
    """Log ``message`` at ``level`` with ``exc``'s traceback; without it if that cannot be
    written; and nothing at all if not even that can (only a ``KeyboardInterrupt`` goes
    on up)."""
    try:
        logger.log(level, message, *args, exc_info=exc)
    except KeyboardInterrupt:
        raise
    except BaseException:
        try:
            logger.log(level, message + " (its traceback could not be written)", *args)
        except KeyboardInterrupt:
            raise
        except BaseException:
            return
