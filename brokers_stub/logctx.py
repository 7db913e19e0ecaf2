"""The broker's structlog logger, whose bound context follows the broker epoch.

Every component logs through one shared `BrokerLog`, so a re-registration (new epoch)
re-binds every later line at once; contextvars would not reach tasks already running.
This module only forwards to structlog: it configures nothing (see metactl.logs).
"""

from __future__ import annotations

from typing import Any

import structlog
from structlog.typing import FilteringBoundLogger


class BrokerLog:
    def __init__(self, broker_id: int, name: str = "metactl.broker") -> None:
        self._log: FilteringBoundLogger = structlog.get_logger(name).bind(broker=broker_id)

    def set_epoch(self, epoch: int) -> None:
        self._log = self._log.bind(epoch=epoch)

    def debug(self, event: str, **kw: Any) -> None:
        self._log.debug(event, **kw)

    def info(self, event: str, **kw: Any) -> None:
        self._log.info(event, **kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._log.warning(event, **kw)

    def error(self, event: str, **kw: Any) -> None:
        self._log.error(event, **kw)

    def exception(self, event: str, **kw: Any) -> None:
        self._log.exception(event, **kw)
