"""The controllers as a chaos run sees them: which one is active, the data-loss counter
of each term, and requests to the one believed active.

`metactl_potential_data_loss_events_total` counts what one *term* committed (it starts
at 0 in each process, and a controller's counters go when it stops being the active
one), so `scrape` keeps, per term (the controller, its pid, and its
`metactl_controller_failovers_total`), the largest value seen while that controller was
active; their sum is compared with the UncleanRecoveryRecords of the log
(docs/chaos.md, "The metric across restarts and failovers").

This module only asks (requests, DescribeCluster, /metrics): it must not start, signal or
fault a process (`chaos.processes`, `chaos.faults`).
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Callable

from chaos.check import TOPIC, counter_sum, gauge_value
from chaos.processes import Processes
from chaos.read import POLL_S
from clients.controller import call
from metactl.errors import MetactlError
from protocol.client import request_once
from protocol.messages.admin import DescribeClusterRequest, DescribeClusterResponse
from protocol.messages.unions import Message

METRIC = "metactl_potential_data_loss_events"
ACTIVE = "metactl_controller_active"
FAILOVERS = "metactl_controller_failovers"


class Watch:
    """Which controller is active (None: unknown, an election may be under way), and
    every term's data-loss counter as scraped."""

    def __init__(self, procs: Processes, controllers: int, say: Callable[[str], None]) -> None:
        self.procs = procs
        self.controllers = controllers
        self.say = say
        self.active: int | None = 1 if controllers == 1 else None
        # The data-loss counter per term, (controller, pid, failovers): the largest value
        # scraped while that controller was active.
        self.term_metric: dict[tuple[str, int, int], float] = {}
        self.metric_scrape_failures = 0
        self.scraped = False  # some controller's counter was read at least once

    def active_first(self) -> str:
        """Every controller's address, the one believed active first (clients try the
        first address first, and a standby's reads may lag)."""
        order = sorted(self.procs.controllers, key=lambda i: i != self.active)
        return ",".join(self.procs.address_of(i) for i in order)

    async def request(self, body: Message, timeout_s: float = 5.0) -> Message:
        """A write (or a read that must be current): to the active controller, following
        NOT_CONTROLLER and riding a failover until `timeout_s` (`clients.controller.call`)."""
        return await call(self.active_first(), body, timeout_s)

    async def describe(self) -> DescribeClusterResponse | None:
        """DescribeCluster from the controller believed active (one try, 2 s)."""
        try:
            r = await request_once(
                self.active_first(), DescribeClusterRequest(topic=TOPIC), timeout_s=2.0
            )
        except (MetactlError, OSError, TimeoutError):
            return None
        return r if isinstance(r, DescribeClusterResponse) else None

    async def wait_for(
        self, check: Callable[[DescribeClusterResponse], bool], what: str, timeout_s: float
    ) -> DescribeClusterResponse | None:
        """Poll DescribeCluster until `check` holds; None after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            r = await self.describe()
            if r is not None and check(r):
                return r
            await asyncio.sleep(POLL_S)  # polling an observable state
        self.say(f"gave up waiting for {what} after {timeout_s:.0f} s")
        return None

    async def scrape(self, i: int) -> float | None:
        """Controller `i`'s /metrics: notes its term's data-loss counter (while it is the
        active one) and whether it is active; returns the counter (None: not active or
        no answer). A paused or stopped controller is not asked."""
        proc = self.procs.controllers[i]
        pid = proc.pid
        if proc.state != "up" or pid is None:
            return None
        url = f"http://{self.procs.metrics_of(i)}/metrics"

        def get() -> str:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return str(resp.read().decode())

        try:
            text = await asyncio.to_thread(get)
        except (OSError, ValueError):
            self.metric_scrape_failures += 1
            return None
        if gauge_value(text, ACTIVE) != 1.0:
            if self.active == i and self.controllers > 1:
                self.active = None
            return None
        self.active = i
        term = int(gauge_value(text, FAILOVERS + "_total") or 0)
        value = counter_sum(text, METRIC)
        key = (proc.name, pid, term)
        self.term_metric[key] = max(self.term_metric.get(key, 0.0), value)
        self.scraped = True
        return value

    async def scrape_all(self) -> None:
        await asyncio.gather(*(self.scrape(i) for i in self.procs.controllers))

    async def await_active(self, timeout_s: float = 30.0) -> None:
        """Scrape every controller until one says it is the active one (after the last
        controller fault an election may still be under way: the heal's answers, and the
        final term's counter, are that controller's)."""
        deadline = time.monotonic() + timeout_s
        while True:
            await self.scrape_all()
            if self.active is not None or time.monotonic() > deadline:
                return
            await asyncio.sleep(POLL_S)  # polling an observable state: an election
