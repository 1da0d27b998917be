"""structlog configuration: the only place processors are set.

Call :func:`configure_logging` once at process start. Bind ``session_id``, ``task_id`` and
``attempt`` with ``structlog.contextvars.bind_contextvars`` at activity entry and per request.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog


def configure_logging(level: str = "info", json: bool = True, file: TextIO | None = None) -> None:
    """Configure structlog and the standard library root logger.

    Args:
        level: ``debug``, ``info``, ``warning`` or ``error``.
        json: render JSON lines (True) or a console format (False).
        file: where lines go (an open text file a benchmark keeps); None: standard error.
    """
    out = sys.stderr if file is None else file
    lvl = getattr(logging, level.upper())
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=max(lvl, logging.INFO), stream=out, format="%(message)s")
    # one line per HTTP request at INFO would drown the events (and name session URLs)
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(max(lvl, logging.WARNING))
