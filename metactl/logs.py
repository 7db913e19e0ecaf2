"""structlog set-up: JSON lines for services, a readable console for the CLI.

Call `configure(json=...)` once at process start. Loggers bind context (broker,
partition, epoch) with `structlog.get_logger().bind(...)`.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog


class _CurrentStderr:
    """Writes to whatever `sys.stderr` is at the time of the write, so that a logger
    configured before stderr is swapped (tests, daemonising) never writes to a closed file."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure(*, json: bool, level: int = logging.INFO, stream: TextIO | None = None) -> None:
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.typing.Processor
    if json:
        processors.append(structlog.processors.format_exc_info)
        renderer = structlog.processors.JSONRenderer(sort_keys=False)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[*processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(stream or _CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
