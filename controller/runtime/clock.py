"""Clocks: the only source of time for the controller. Pure code receives `now_ms`.

A clock also waits: the driver's timers (recovery windows) sleep on the injected clock,
so a virtual clock fires them when it is moved, exactly as real time does.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...

    async def sleep_until(self, deadline_ms: int) -> None:
        """Return once `now_ms()` has reached `deadline_ms`."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    async def sleep_until(self, deadline_ms: int) -> None:
        # A timer: the deadline is the point. Waking a hair early is harmless: the driver
        # evaluates, finds nothing due and sleeps again for the rest.
        await asyncio.sleep(max(0, deadline_ms - self.now_ms()) / 1000)


class VirtualClock:
    """Time that moves only when told to: the scenario runner, simulators and tests use it.
    Moving it wakes every sleeper whose deadline it reaches."""

    def __init__(self, start_ms: int = 0) -> None:
        self._now = start_ms
        self._sleepers: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now_ms(self) -> int:
        return self._now

    def set(self, now_ms: int) -> None:
        if now_ms < self._now:
            raise ValueError(f"virtual time cannot go back ({now_ms} < {self._now})")
        self._now = now_ms
        while self._sleepers and self._sleepers[0][0] <= now_ms:
            _, _, waiter = heapq.heappop(self._sleepers)
            if not waiter.done():
                waiter.set_result(None)

    async def sleep_until(self, deadline_ms: int) -> None:
        if deadline_ms <= self._now:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (deadline_ms, next(self._seq), waiter))
        await waiter
