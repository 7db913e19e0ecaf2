"""structlog set-up: JSON lines for services, a readable console for the CLI.

Call `configure(json=...)` once at process start. Loggers bind context (broker,
partition, epoch) with `structlog.get_logger().bind(...)`.

Importing this module loads nothing: structlog is imported by `configure`, and without
`rich` when this is the first import of structlog (`import structlog` imports its
console renderer and tracebacks module, which load rich whenever it is installed: a
third of a CLI command's start-up, issue 34). Nothing here needs rich: the console
renders an exception as Python prints it (`plain_traceback`), installed rich or not, and
`rich` imports as usual afterwards (the progress bars of `metactl simulate`, `chaos` and
`audit` use it). This module configures logging only; it never logs.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO


class _CurrentStderr:
    """Writes to whatever `sys.stderr` is at the time of the write, so that a logger
    configured before stderr is swapped (tests, daemonising) never writes to a closed file."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def import_structlog() -> None:
    """Import structlog, without rich if neither is imported yet (see the module docs):
    rich is hidden only while structlog's modules load (`import rich` fails then, which
    structlog takes as "not installed")."""
    if "structlog" in sys.modules or "rich" in sys.modules:
        return
    sys.modules["rich"] = None  # type: ignore[assignment]  # `import rich`: ImportError
    try:
        import structlog  # noqa: F401
    finally:
        if "rich" in sys.modules and sys.modules["rich"] is None:
            del sys.modules["rich"]


def configure(*, json: bool, level: int = logging.INFO, stream: TextIO | None = None) -> None:
    import_structlog()
    import structlog

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
        renderer = structlog.dev.ConsoleRenderer(
            colors=False, exception_formatter=structlog.dev.plain_traceback
        )
    structlog.configure(
        processors=[*processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(stream or _CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
