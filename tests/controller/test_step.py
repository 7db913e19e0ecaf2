"""The one event step routes every event to its handler, threads the recovery tracker,
evaluates what the delta touched, and leaves a refused request without a trace."""

from __future__ import annotations

import pytest

from controller.core.config import ControllerConfig
from controller.core.step import ControllerState, Rules, Tick, step, touched
from controller.core.work import EMPTY_BACKLOG
from metactl.errors import InvalidRequestError, StaleBrokerEpochError
from metadata_image.image import ClusterImage
from metadata_image.replay import apply
from metadata_log.records import (
    ClearElrRecord,
    FenceBrokerRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
)
from protocol.messages.admin import CreateTopic, ElectLeader
from protocol.messages.broker_controller import (
    AlterPartition,
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    IsrMember,
    PartitionView,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.messages.internal import (
    Ack,
    ControlledShutdown,
    ControlledShutdownResponse,
    CreateTopicResponse,
    FenceBroker,
    ReplicaLogInfo,
    UnfenceBroker,
)
from tests.controller.testkit import POLICIES, Cluster

CONFIG = ControllerConfig()
RULES = Rules(CONFIG, POLICIES)


class _Run(Cluster):
    """The test kit's cluster (every event through the one step), called for a response."""

    def __call__(self, event: object) -> object:
        return self.submit(event).response  # type: ignore[arg-type]


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


def test_an_unknown_request_is_refused_and_changes_nothing() -> None:
    state = ControllerState(ClusterImage())
    with pytest.raises(InvalidRequestError, match="does not handle Ack"):
        step(state, Ack(), 0, RULES)  # type: ignore[arg-type]


def test_heartbeat_rule_lives_in_the_step() -> None:
    run = _Run()
    run(RegisterBroker(broker_id=1, incarnation_id="i1"))
    epoch = run.epoch(1)
    with pytest.raises(StaleBrokerEpochError):
        run(BrokerHeartbeatRequest(broker_id=1, broker_epoch=epoch + 7, metadata_offset=99))
    # Not caught up with its own registration: stays fenced.
    r = run(BrokerHeartbeatRequest(broker_id=1, broker_epoch=epoch, metadata_offset=epoch))
    assert r == BrokerHeartbeatResponse(
        is_fenced=True, in_controlled_shutdown=False, should_shut_down=False
    )
    # Asking to stay fenced keeps it fenced even when caught up.
    r = run(
        BrokerHeartbeatRequest(
            broker_id=1, broker_epoch=epoch, metadata_offset=epoch + 1, want_fence=True
        )
    )
    assert isinstance(r, BrokerHeartbeatResponse) and r.is_fenced
    r = run(BrokerHeartbeatRequest(broker_id=1, broker_epoch=epoch, metadata_offset=epoch + 1))
    assert isinstance(r, BrokerHeartbeatResponse) and not r.is_fenced
    assert not run.image.brokers[1].fenced
    run(CreateTopic(name="t", assignments=[[1]], min_isr=1))
    r = run(
        BrokerHeartbeatRequest(
            broker_id=1, broker_epoch=epoch, metadata_offset=epoch + 9, want_shutdown=True
        )
    )
    assert r == BrokerHeartbeatResponse(
        is_fenced=False, in_controlled_shutdown=True, should_shut_down=True
    )
    assert run.image.brokers[1].in_controlled_shutdown


def test_timers_fire_on_tick_and_the_step_reports_the_deadline() -> None:
    run = _Run()
    for b in (1, 2):
        run(RegisterBroker(broker_id=b, incarnation_id=f"i{b}"))
        run(UnfenceBroker(broker_id=b, broker_epoch=run.epoch(b)))
    run(CreateTopic(name="t", assignments=[[1, 2]], min_isr=2, recovery_strategy="proactive"))
    for b in (1, 2):
        run(FenceBroker(broker_id=b))
    run(RegisterBroker(broker_id=2, incarnation_id="again"))
    result = step(run.state, UnfenceBroker(broker_id=2, broker_epoch=run.epoch(2)), 5, RULES)
    assert result.next_deadline_ms is not None
    assert [i.broker_id for i in result.inspections] == [2]
    early = step(result.state, Tick(), result.next_deadline_ms - 1, RULES)
    assert early.records == []
    due = step(early.state, Tick(), result.next_deadline_ms, RULES)
    # No answer arrived: the window restarts rather than electing blindly.
    assert due.records == [] and due.next_deadline_ms is not None
    assert due.next_deadline_ms > result.next_deadline_ms


def test_the_delta_names_what_changed_and_drives_evaluation() -> None:
    records = [
        RegisterBrokerRecord(broker_id=1, incarnation_id="a", broker_epoch=0),
        RegisterBrokerRecord(broker_id=2, incarnation_id="b", broker_epoch=1, clean=True),
        UnfenceBrokerRecord(broker_id=2, broker_epoch=1),
        TopicRecord(name="t", topic_id="x", partitions=2, min_isr=1),
        PartitionRecord(topic="t", partition=0, replicas=[1], isr=[], elr=[1]),
        PartitionRecord(topic="t", partition=1, replicas=[2], isr=[2], leader=2),
    ]
    image, delta = apply(ClusterImage(), records)
    assert delta.brokers == {1, 2} and delta.topics == {"t"}
    assert delta.partitions == {("t", 0), ("t", 1)}
    assert delta.unclean_registrations == [1]
    assert delta.records_by_type == {
        "RegisterBroker": 2, "UnfenceBroker": 1, "Topic": 1, "Partition": 2,
    }  # fmt: skip
    assert touched(image, delta) == {("t", 0)}  # only the leaderless one
    # A fence of broker 1 touches its leaderless partition; one of an unknown epoch nothing.
    _, d = apply(image, [FenceBrokerRecord(broker_id=1, broker_epoch=0)])
    assert touched(image, d) == {("t", 0)}
    _, d = apply(image, [FenceBrokerRecord(broker_id=2, broker_epoch=99)])
    assert d.brokers == set() and touched(image, d) == frozenset()
    _, d = apply(image, [ClearElrRecord(topic="t")])
    assert d.partitions == {("t", 0)}
    change = PartitionChangeRecord(
        topic="t", partition=1, reason="fence", partition_epoch=1, leader_epoch=1, leader=-1
    )  # type: ignore[arg-type]
    after, d = apply(image, [change])
    assert touched(after, d) == {("t", 1)}  # t-0 is still offline, but the delta spares it
    # Records absorbed from outside a step are evaluated by the next step.
    state = ControllerState(image, backlog=EMPTY_BACKLOG)
    absorbed, _ = state.absorb([change])
    assert set(absorbed.backlog) == {("t", 1)} and not absorbed.idle
    assert ControllerState(image).absorb([change])[0].backlog.everything


def test_a_heartbeat_from_an_unknown_broker_is_refused() -> None:
    from metactl.errors import BrokerIdNotRegisteredError

    with pytest.raises(BrokerIdNotRegisteredError):
        _Run()(BrokerHeartbeatRequest(broker_id=9, broker_epoch=0, metadata_offset=0))


def test_delta_bookkeeping() -> None:
    from metadata_image.delta import Election, MetadataDelta
    from metadata_log.records import ElectionKind

    a = Election(("t", 0), 1, ElectionKind.ISR)
    assert a == Election(("t", 0), 1, ElectionKind.ISR) and a != "x"
    assert len({a, Election(("t", 0), 1, ElectionKind.ISR)}) == 1
    assert "leader=1" in repr(a)
    d = MetadataDelta()
    assert d.empty and d.record_count == 0
    other = MetadataDelta()
    other.records_by_type["Topic"] = 2
    other.elections.append(a)
    other.topics.add("t")
    assert d.update(other) is d and d.record_count == 2 and not d.empty
    assert d.update(other).records_by_type == {"Topic": 4}
    assert "topics=['t']" in repr(d) and "elections=2" in repr(d)
