"""`decide` routes every request to its handler and threads the recovery tracker."""

from __future__ import annotations

from controller.core.config import ControllerConfig
from controller.core.dispatch import decide
from controller.core.recovery.tracker import RecoveryTracker, evaluate
from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from protocol.requests import (
    Ack,
    AlterPartition,
    ControlledShutdown,
    ControlledShutdownResponse,
    ControllerRequest,
    CreateTopic,
    CreateTopicResponse,
    ElectLeader,
    FenceBroker,
    IsrMember,
    PartitionView,
    RegisterBroker,
    RegisterBrokerResponse,
    ReplicaLogInfo,
    UnfenceBroker,
)
from tests.controller.testkit import POLICIES

CONFIG = ControllerConfig()
STRATEGIES = frozenset(POLICIES)


class _Run:
    def __init__(self) -> None:
        self.image = ClusterImage()
        self.tracker = RecoveryTracker()

    def __call__(self, request: ControllerRequest) -> object:
        records, response, self.tracker = decide(
            self.image, self.tracker, request, 0, config=CONFIG, strategies=STRATEGIES
        )
        self.image = replay(self.image, records)
        step = evaluate(self.image, self.tracker, 0, policies=POLICIES, config=CONFIG)
        self.image, self.tracker = replay(self.image, step.records), step.tracker
        return response

    def epoch(self, b: int) -> int:
        return self.image.brokers[b].epoch


def test_every_request_reaches_its_handler() -> None:
    run = _Run()
    for b in (1, 2, 3):
        assert isinstance(
            run(RegisterBroker(broker_id=b, incarnation_id=f"i{b}")), RegisterBrokerResponse
        )
        assert isinstance(run(UnfenceBroker(broker_id=b, broker_epoch=run.epoch(b))), Ack)
    created = run(CreateTopic(name="t", assignments=[[1, 2, 3]], min_isr=2))
    assert isinstance(created, CreateTopicResponse) and created.assignments == [[1, 2, 3]]
    p = run.image.partitions[("t", 0)]
    shrunk = run(
        AlterPartition(
            topic="t", partition=0, leader=1, broker_epoch=run.epoch(1),
            partition_epoch=p.partition_epoch,
            isr=[IsrMember(broker_id=b, broker_epoch=run.epoch(b)) for b in (1, 2)],
        )
    )  # fmt: skip
    assert isinstance(shrunk, PartitionView) and shrunk.isr == [1, 2]
    assert isinstance(
        run(ControlledShutdown(broker_id=1, broker_epoch=run.epoch(1))), ControlledShutdownResponse
    )
    assert run.image.partitions[("t", 0)].leader == 2
    # Broker 1 comes back cleanly and is preferred again once in the ISR.
    run(RegisterBroker(broker_id=1, incarnation_id="again", previous_epoch=run.epoch(1)))
    run(UnfenceBroker(broker_id=1, broker_epoch=run.epoch(1)))
    p = run.image.partitions[("t", 0)]
    run(
        AlterPartition(
            topic="t", partition=0, leader=2, broker_epoch=run.epoch(2),
            partition_epoch=p.partition_epoch,
            isr=[IsrMember(broker_id=b, broker_epoch=run.epoch(b)) for b in (1, 2)],
        )
    )  # fmt: skip
    preferred = run(ElectLeader(topic="t", partition=0, election_type="preferred"))
    assert isinstance(preferred, PartitionView) and preferred.leader == 1
    # Everyone fails and comes back uncleanly: balanced recovery waits for answers.
    for b in (3, 2, 1):
        assert isinstance(run(FenceBroker(broker_id=b)), Ack)
    for b in (1, 2, 3):
        run(RegisterBroker(broker_id=b, incarnation_id=f"crash-{b}"))
        run(UnfenceBroker(broker_id=b, broker_epoch=run.epoch(b)))
    assert ("t", 0) in run.tracker.pending
    answer = ReplicaLogInfo(
        broker_id=1, broker_epoch=run.epoch(1), topic="t", partition=0,
        last_leader_epoch=9, log_end_offset=9,
    )  # fmt: skip
    assert isinstance(run(answer), Ack)
    assert run.tracker.pending[("t", 0)].answers[1].log_end_offset == 9
    manual = run(ElectLeader(topic="t", partition=0, election_type="unclean", replica=2))
    assert isinstance(manual, PartitionView) and manual.leader == 2
    assert ("t", 0) not in run.tracker.pending


def test_an_unknown_request_is_refused() -> None:
    import pytest

    from metactl.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="does not handle Ack"):
        decide(ClusterImage(), RecoveryTracker(), Ack(), 0, config=CONFIG, strategies=STRATEGIES)  # type: ignore[arg-type]
