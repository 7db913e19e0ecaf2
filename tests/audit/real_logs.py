"""A real cluster's log for the audit tests (issue 34): a controller and three brokers as
real processes (`tests.e2e.cluster`), a topic deleted and created again under its name,
a real outage left open, and a clean stop of everything at the end.

What happens, in order (the audits' expected answers follow from it):

1. Brokers 1, 2 and 3 start; ``orders`` is created (its first generation: partitions
   [1, 2, 3] and [3, 1, 2], MinISR 2) and ``pinned`` (one partition on broker 3 alone).
2. Broker 3 is killed (SIGKILL): its session times out, it is fenced; ``orders-1``
   elects a leader from its ISR (an election of the first generation) and ``pinned-0``
   loses its leader for good: a real outage, still open at the end of the log.
3. ``orders`` is deleted and created again (a new id): partitions [1, 2], [2, 1] and
   [1, 2], MinISR 1.
4. The cluster is stopped cleanly: brokers 1 and 2 get SIGTERM (each a controlled
   shutdown), then the controller. The second generation's partitions lose their
   leaders in the last controlled shutdown: stopped with the cluster, not an outage.

It must not assert what the audits answer (the tests do); it checks only that the
cluster did what the steps above say, so that a failing audit test is the audit's.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from metadata_log.records import FenceBrokerRecord
from protocol.messages.admin import (
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeClusterResponse,
)
from tests.e2e.cluster import Cluster

ORDERS = "orders"
PINNED = "pinned"


@dataclass(frozen=True)
class StoppedLog:
    """Where the log is (the cluster's data directory) and the ids it gave the topics."""

    data_dir: Path
    first_orders_id: str
    second_orders_id: str
    pinned_id: str


async def _create(c: Cluster, name: str, assignments: list[list[int]], min_isr: int) -> str:
    r = await c.request(
        CreateTopicsRequest(
            topics=[CreateTopic(name=name, assignments=assignments, min_isr=min_isr)]
        )
    )
    assert isinstance(r, CreateTopicsResponse) and r.results[0].error_code is None, r
    topic_id = r.results[0].topic_id
    assert topic_id
    return topic_id


def _led(s: DescribeClusterResponse, topic: str, n: int) -> bool:
    mine = [p for p in s.partitions if p.topic == topic]
    return len(mine) == n and all(p.leader >= 0 for p in mine)


async def _run(c: Cluster) -> tuple[str, str, str]:
    for b in (1, 2, 3):
        c.start_broker(b)
    await c.wait_until(
        lambda s: {b.broker_id for b in s.brokers if not b.fenced} == {1, 2, 3}, "3 active"
    )
    first = await _create(c, ORDERS, [[1, 2, 3], [3, 1, 2]], 2)
    pinned = await _create(c, PINNED, [[3]], 1)
    await c.wait_until(lambda s: _led(s, ORDERS, 2) and _led(s, PINNED, 1), "topics led")
    c.kill_broker(3)
    await c.wait_for_record(
        lambda r: isinstance(r, FenceBrokerRecord) and r.broker_id == 3, "broker 3 fenced"
    )
    await c.wait_until(
        lambda s: any(p.topic == PINNED and p.leader < 0 for p in s.partitions), "pinned offline"
    )
    r = await c.request(DeleteTopicsRequest(topics=[ORDERS]))
    assert isinstance(r, DeleteTopicsResponse) and r.results[0].error_code is None, r
    second = await _create(c, ORDERS, [[1, 2], [2, 1], [1, 2]], 1)
    assert second != first
    await c.wait_until(lambda s: _led(s, ORDERS, 3), "orders again, led")
    return first, second, pinned


def stopped_log(root: Path) -> StoppedLog:
    """Run the cluster of the module's steps in `root` and stop it cleanly."""
    c = Cluster(root, tls=False)
    try:
        c.start_controller()
        first, second, pinned = asyncio.run(_run(c))
    finally:
        c.stop()  # brokers first (SIGTERM: controlled shutdowns), then the controller
    return StoppedLog(root / "controller", first, second, pinned)
