"""The automatic leader balance as the running controller does it, on a real SQLite log
with virtual time: the driver sleeps until the check is due and steps it by itself (no
request, no `elect`), the elections are counted by `metactl_leader_balance_elections_total`
(and among the preferred ones of `metactl_elections_total`, where an operator's count
too), and the event feed tells them from an operator's."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from controller.core.config import ControllerConfig
from eventfeed.feed import Feed
from metadata_image.delta import MetadataDelta
from metadata_log.records import ChangeReason, MetadataRecord, PartitionChangeRecord
from protocol.messages.admin import ElectLeader
from protocol.messages.broker_controller import AlterPartition, IsrMember
from tests.observability.kit import Cluster

INTERVAL_S = 5
BALANCE = "metactl_leader_balance_elections_total"
ELECTIONS = "metactl_elections_total"


@dataclass(frozen=True)
class Entry:
    offset: int
    timestamp_ms: int
    record: MetadataRecord


async def rejoin(c: Cluster, topic: str, partition: int, broker: int) -> None:
    """The partition's leader adds `broker` back to its ISR (it caught up)."""
    p = c.ctl.image.partitions[(topic, partition)]
    members = sorted(p.isr | {broker})
    await c.submit(
        AlterPartition(
            topic=topic,
            partition=partition,
            leader=p.leader,
            broker_epoch=c.epoch(p.leader),
            partition_epoch=p.partition_epoch,
            isr=[IsrMember(broker_id=b, broker_epoch=c.epoch(b)) for b in members],
        )
    )


async def test_the_driver_wakes_for_the_check_and_counts_its_elections(tmp_path: Path) -> None:
    config = ControllerConfig(leader_imbalance_check_interval_seconds=INTERVAL_S)
    c = await Cluster.open(tmp_path, config)
    balanced = asyncio.Event()

    def on_commit(base: int, records: object, delta: MetadataDelta, now_ms: int) -> None:
        for r in c.committed:
            if isinstance(r, PartitionChangeRecord) and r.reason is ChangeReason.LEADER_BALANCE:
                balanced.set()

    c.ctl.commit_listeners.append(on_commit)
    try:
        await c.start_brokers(1, 2, 3)
        await c.create_topic("t", [[1, 2, 3], [2, 3, 1], [3, 1, 2], [1, 3, 2]], min_isr=1)
        assert c.value(BALANCE) == 0.0
        await c.fence(1)  # leadership leaves broker 1
        await c.register(1)
        await c.unfence(1)
        for i in (0, 3):
            await rejoin(c, "t", i, 1)
        # An operator's preferred election: a preferred election, not the balance's.
        await c.submit(ElectLeader(topic="t", partition=3, election_type="preferred"))
        assert c.value(ELECTIONS, kind="preferred") == 1.0 and c.value(BALANCE) == 0.0
        due = c.ctl.next_deadline_ms
        assert due == INTERVAL_S * 1000  # scheduled when the controller started
        assert not balanced.is_set()
        c.clock.set(due)  # only time moves: the driver steps the check itself
        await asyncio.wait_for(balanced.wait(), timeout=60)
        await c.ctl.drain()
        p0 = c.ctl.committed_image.partitions[("t", 0)]
        assert p0.leader == 1
        auto = [
            r
            for r in c.committed
            if isinstance(r, PartitionChangeRecord) and r.reason is ChangeReason.LEADER_BALANCE
        ]
        assert [(r.partition, r.leader) for r in auto] == [(0, 1)]
        assert c.value(BALANCE) == 1.0
        assert c.value(ELECTIONS, kind="preferred") == 2.0
        assert c.ctl.next_deadline_ms is None  # balanced: nothing scheduled
        # The feed's lines: the balance's election says so, the operator's does not.
        events = Feed().add([Entry(i, 0, r) for i, r in enumerate(c.committed)])
        lines = [e.text for e in events if e.text.startswith(("t-0 leader", "t-3 leader"))]
        assert lines[-2:] == [
            "t-3 leader 3→1 (preferred)",
            "t-0 leader 2→1 (preferred, automatic leader balance)",
        ]
    finally:
        await c.close()


async def test_off_the_controller_never_wakes_for_a_check(tmp_path: Path) -> None:
    config = ControllerConfig(auto_leader_rebalance_enable=False)
    c = await Cluster.open(tmp_path, config)
    try:
        await c.start_brokers(1, 2)
        await c.create_topic("t", [[1, 2]], min_isr=1)
        await c.fence(1)
        await c.register(1)
        await c.unfence(1)
        await rejoin(c, "t", 0, 1)
        assert c.ctl.next_deadline_ms is None
        c.clock.set(3600 * 1000)
        await c.ctl.tick()
        assert c.ctl.committed_image.partitions[("t", 0)].leader == 2
        assert c.value(BALANCE) == 0.0
    finally:
        await c.close()
