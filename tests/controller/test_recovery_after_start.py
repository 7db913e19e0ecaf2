"""Recovery evaluation after a start or a failover runs a work budget per event (issue
30, item 7).

A controller that starts (or reverts to its committed image) must look at every
leaderless partition again (its backlog is `EVERYTHING`). It used to list them all in
its first step (`Backlog.resolve`: a dict of every offline partition, grouped by topic),
which on a 1,000,000-partition log held the controller for seconds in one event. Now a
large image is swept, a bounded stretch per step (`controller.core.work.Sweep`): no
step walks the set of offline partitions, and the sweep still reaches every one of them,
with the same outcome as the full pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from controller.core import work
from controller.core.config import ControllerConfig
from controller.core.recovery.tracker import evaluate_all
from controller.core.step import ControllerState, Rules, Tick, settle, step
from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from metadata_log.records import (
    FenceBrokerRecord,
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
)
from tests.controller.testkit import POLICIES

CONFIG = ControllerConfig(unclean_recovery_strategy="proactive", unclean_recovery_window_ms=0)
TOPICS = 6
PER_TOPIC = 50


def leaderless_image() -> ClusterImage:
    """Broker 1 fenced, the only replica of 300 leaderless partitions in 6 topics (its
    ELR); broker 2 healthy, leading a small topic."""
    records: list[MetadataRecord] = []
    for b in (1, 2):
        records += [
            RegisterBrokerRecord(broker_id=b, incarnation_id=f"b{b}", broker_epoch=b - 1),
            UnfenceBrokerRecord(broker_id=b, broker_epoch=b - 1),
        ]
    records.append(FenceBrokerRecord(broker_id=1, broker_epoch=0))
    for t in range(TOPICS):
        name = f"t{t}"
        records.append(TopicRecord(name=name, topic_id=name, partitions=PER_TOPIC))
        records += [
            PartitionRecord(topic=name, partition=i, replicas=[1, 2] if i % 7 == 0 else [1],
                            isr=[2] if i % 7 == 0 else [], elr=[] if i % 7 == 0 else [1],
                            leader=2 if i % 7 == 0 else -1, leader_epoch=1, partition_epoch=1)
            for i in range(PER_TOPIC)
        ]  # fmt: skip
    image = replay(ClusterImage(), records)
    assert len(image.offline) > 200
    return image


class NoWalk:
    """The image's offline set, answering membership and size but refusing to be walked:
    a step that iterates it does O(offline partitions) of work."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __contains__(self, tp: object) -> bool:
        return tp in self.inner

    def __len__(self) -> int:
        return len(self.inner)

    def __bool__(self) -> bool:
        return bool(self.inner)

    def get(self, tp: object, default: Any = None) -> Any:
        return self.inner.get(tp, default)

    def __iter__(self) -> Iterator[Any]:
        raise AssertionError("a step walked every offline partition")


def test_the_first_step_after_a_start_walks_no_set_of_offline_partitions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fails on the old `Backlog.resolve` (a dict of every offline partition in the first
    step): with the threshold below this image's 257 leaderless partitions, the first
    step after a start may only sweep a bounded stretch of partitions."""
    monkeypatch.setattr(work, "MATERIALIZE_BELOW", 10)
    image = leaderless_image()
    rules = Rules(CONFIG, POLICIES, work_budget=5)
    started = ControllerState(msgspec.structs.replace(image, offline=NoWalk(image.offline)))
    result = step(started, Tick(), 1_000, rules)
    # It looked at no more than the budget's sweep, and left the rest queued.
    assert not result.state.idle
    noted = result.state.tracker.offline
    assert 0 < len(noted) <= 5
    assert all(tp in image.offline for tp in noted)


@pytest.mark.parametrize("threshold", [0, work.MATERIALIZE_BELOW])
def test_a_swept_start_reaches_what_the_full_pass_does(
    monkeypatch: pytest.MonkeyPatch, threshold: int
) -> None:
    """Swept (threshold 0) or listed, the Ticks after a start evaluate every leaderless
    partition a budget at a time: the same recoveries, inspections and notes as one full
    pass (`evaluate_all`)."""
    monkeypatch.setattr(work, "MATERIALIZE_BELOW", threshold)
    image = leaderless_image()
    # Broker 1 back, unclean: the proactive strategy recovers every partition from it.
    image = replay(
        image, [RegisterBrokerRecord(broker_id=1, incarnation_id="b1-2", broker_epoch=9)]
    )
    image = replay(image, [UnfenceBrokerRecord(broker_id=1, broker_epoch=9)])
    rules = Rules(CONFIG, POLICIES, work_budget=7)
    full = evaluate_all(
        image, ControllerState(image).tracker, 1_000, policies=POLICIES, config=CONFIG
    )
    steps = 0
    state = ControllerState(image)
    inspections = []
    while not state.idle:
        result = step(state, Tick(), 1_000, rules)
        inspections += result.inspections
        state = result.state
        steps += 1
    # More than one step: a budget per step.
    assert steps >= len(image.offline) // 7
    key = lambda i: (i.topic, i.partition, i.broker_id)  # noqa: E731
    assert sorted(inspections, key=key) == sorted(full.inspections, key=key)
    assert set(state.tracker.pending) == set(full.tracker.pending)
    assert set(state.tracker.offline) == set(full.tracker.offline)
    # And settling gives the same: every leaderless partition was looked at.
    settled = settle(ControllerState(image), Tick(), 1_000, rules)
    assert set(settled.state.tracker.pending) == set(full.tracker.pending)


def test_a_sweep_hands_out_partitions_in_order_with_and_without_a_filter() -> None:
    """`Sweep.take` directly: every partition in (topic, partition) order in pieces of
    `n`; with a filter only its members, looking at most `SWEEP_SCAN` x `n` per take; with
    `n` None everything left at once; and a backlog lists its sweep's partitions."""
    sweep = work.Sweep((("a", 3), ("b", 2)))
    got, rest = sweep.take(2)
    assert got == [("a", 0), ("a", 1)] and not rest.done
    got, rest = rest.take(2)
    assert got == [("a", 2), ("b", 0)]
    got, rest = rest.take(None)
    assert got == [("b", 1)] and rest.done
    keep = {("a", 1), ("b", 1)}
    got, rest = sweep.take(None, keep)
    assert got == [("a", 1), ("b", 1)] and rest.done
    big = work.Sweep((("c", work.SWEEP_SCAN * 3),))
    got, rest = big.take(1, {("c", work.SWEEP_SCAN * 2)})
    assert got == [] and rest.position == work.SWEEP_SCAN  # looked at SWEEP_SCAN, found none
    backlog = work.Backlog(sweep=sweep)
    assert list(backlog) == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)]
