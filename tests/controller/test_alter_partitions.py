"""Batched AlterPartition (`AlterPartitions`): each item decided and answered alone,
through the one step, inside the work budget."""

from __future__ import annotations

import msgspec
import pytest

from controller.core.config import ControllerConfig
from controller.core.partition_handlers import alter_partitions
from controller.core.step import Rules
from metactl.errors import InvalidRequestError
from metadata_log.records import PartitionChangeRecord
from protocol.messages.broker_controller import AlterPartitions, AlterPartitionsResponse
from tests.controller.testkit import POLICIES, Cluster

CFG = ControllerConfig()


def cluster(partitions: int = 4) -> Cluster:
    """Brokers 1-3; topic t of `partitions` at RF 3, every ISR full."""
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", partitions=partitions, replication_factor=3, min_isr=2)
    return c


def shrunk(c: Cluster, partitions: range) -> None:
    """Each partition's last replica (never its leader) out of its ISR, by its leader's
    AlterPartition."""
    for i in partitions:
        p = c.p("t", i)
        c.alter(sorted(p.isr - {p.replicas[-1]}), partition=i)


def regrow(c: Cluster, i: int) -> list[int]:
    """The full ISR of partition i, as its leader proposes it back."""
    return sorted(c.p("t", i).replicas)


def test_each_item_is_answered_alone_and_a_refusal_refuses_only_its_item() -> None:
    c = cluster()
    shrunk(c, range(4))
    items = [c.alter_request(regrow(c, i), partition=i) for i in range(4)]
    # Item 1 proposes against a stale partition epoch; item 3 names item 0's partition.
    items[1] = msgspec.structs.replace(items[1], partition_epoch=0)
    items[3] = msgspec.structs.replace(items[0])
    before = {i: c.p("t", i).partition_epoch for i in range(4)}
    r = c.run(AlterPartitions(items=items))
    assert isinstance(r.response, AlterPartitionsResponse)
    codes = [res.error_code for res in r.response.results]
    assert codes == [None, "INVALID_UPDATE_VERSION", None, "INVALID_REQUEST"]
    assert [(res.topic, res.partition) for res in r.response.results] == [
        ("t", 0), ("t", 1), ("t", 2), ("t", 0),
    ]  # fmt: skip
    # The accepted items are committed, each as its own single AlterPartition would be.
    for i in (0, 2):
        assert c.p("t", i).replicas[-1] in c.p("t", i).isr
        view = r.response.results[i].view
        assert view is not None and view.isr == sorted(c.p("t", i).isr)
        assert view.partition_epoch == c.p("t", i).partition_epoch == before[i] + 1
    assert c.p("t", 1).replicas[-1] not in c.p("t", 1).isr
    assert c.p("t", 1).partition_epoch == before[1]
    assert len([x for x in r.records if isinstance(x, PartitionChangeRecord)]) == 2


def test_a_batch_writes_what_the_single_requests_write() -> None:
    batched, single = cluster(), cluster()
    for c in (batched, single):
        shrunk(c, range(4))
    items = [batched.alter_request(regrow(batched, i), partition=i) for i in range(4)]
    r = batched.run(AlterPartitions(items=items))
    singles = [single.run(item).records for item in items]
    assert r.records == [rec for records in singles for rec in records]
    assert batched.image.same_state(single.image)


def test_an_unknown_partition_is_an_item_error() -> None:
    c = cluster(1)
    item = msgspec.structs.replace(c.alter_request([1, 2, 3]), partition=7)
    r = c.run(AlterPartitions(items=[item]))
    assert isinstance(r.response, AlterPartitionsResponse)
    assert r.response.results[0].error_code == "UNKNOWN_TOPIC_OR_PARTITION"
    assert r.records == []


def test_a_piece_over_the_work_budget_is_refused_whole() -> None:
    c = cluster(4)
    items = [c.alter_request([1, 2, 3], partition=i) for i in range(4)]
    with pytest.raises(InvalidRequestError, match="over the work budget 3"):
        alter_partitions(c.image, AlterPartitions(items=items), 0, CFG, budget=3)
    # Within the budget (and with none), the same items are decided.
    assert alter_partitions(c.image, AlterPartitions(items=items[:3]), 0, CFG, budget=3)
    small = Cluster()
    small.rules = Rules(CFG, POLICIES, work_budget=3)
    small.start(1, 2, 3)
    small.create("t", partitions=4, replication_factor=3, min_isr=2)
    with pytest.raises(InvalidRequestError):
        small.run(
            AlterPartitions(items=[small.alter_request([1, 2, 3], partition=i) for i in range(4)])
        )
