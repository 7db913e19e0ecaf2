"""Clocks: the only source of time for the controller. Pure code receives `now_ms`."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class VirtualClock:
    """Time that moves only when told to: the scenario runner and tests use it."""

    def __init__(self, start_ms: int = 0) -> None:
        self._now = start_ms

    def now_ms(self) -> int:
        return self._now

    def set(self, now_ms: int) -> None:
        if now_ms < self._now:
            raise ValueError(f"virtual time cannot go back ({now_ms} < {self._now})")
        self._now = now_ms
