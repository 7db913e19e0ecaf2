"""Transactions decided by the pure step: an event whose records do not fit in one batch
is wrapped in begin/end markers (offsets, and so broker epochs, account for them), and a
large topic is created in slices inside one transaction."""

from __future__ import annotations

import pytest

from controller.core.handler_result import CreateTopicSlice
from controller.core.step import Event, Rules, Tick, transaction_name
from metadata_image.transactions import LogReplay, replay_log
from metadata_log.records import (
    BeginTransactionRecord,
    EndTransactionRecord,
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UncleanRecoveryRecord,
    encode_batch,
)
from protocol.messages.admin import CreateTopic
from protocol.messages.broker_controller import (
    AlterPartition,
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.messages.internal import (
    Ack,
    ControlledShutdown,
    ControlledShutdownResponse,
    CreateTopicResponse,
    FenceBroker,
    UnfenceBroker,
)
from tests.controller.testkit import Cluster


def _cluster(partitions: int = 60, min_isr: int = 2) -> Cluster:
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", partitions=partitions, replication_factor=3, min_isr=min_isr)
    return c


def _limit(c: Cluster, **rules: int | None) -> None:
    c.rules = Rules(c.config, c.policies, **rules)  # type: ignore[arg-type]


def _markers(records: list[MetadataRecord]) -> list[str]:
    return [
        type(r).__name__
        for r in records
        if isinstance(r, BeginTransactionRecord | EndTransactionRecord)
    ]


def test_records_that_fit_in_a_batch_are_not_a_transaction() -> None:
    c = _cluster()
    result = c.submit(FenceBroker(broker_id=1))
    assert _markers(result.records) == []
    assert 0 < result.encoded_bytes <= c.rules.max_batch_bytes
    # The step's encoding is the batch the log stores (it is not encoded again).
    assert result.encoded == encode_batch(result.records)
    assert result.encoded_bytes == len(result.encoded)


def test_a_fence_too_large_for_one_batch_is_one_transaction() -> None:
    plain, wrapped = _cluster(), _cluster()
    base = wrapped.image.end_offset
    _limit(wrapped, max_batch_bytes=2000)
    expected = plain.submit(FenceBroker(broker_id=1))
    result = wrapped.submit(FenceBroker(broker_id=1))
    assert result.encoded_bytes > 2000
    assert result.encoded is None  # split into batches by the committer, encoded there
    begin, *inner, end = result.records
    assert begin == BeginTransactionRecord(name="FenceBroker 1")
    assert isinstance(end, EndTransactionRecord)
    assert inner == expected.records and len(inner) > 30
    image = result.state.image
    assert image.end_offset == base + len(result.records) == expected.state.image.end_offset + 2
    assert image.partitions == expected.state.image.partitions
    assert image.brokers == expected.state.image.brokers
    assert result.delta.partitions == expected.delta.partitions
    assert result.delta.records_by_type["BeginTransaction"] == 1
    assert result.delta.records_by_type["EndTransaction"] == 1
    assert result.response == expected.response
    # A reader of the log gets the same image.
    assert replay_log(LogReplay(), wrapped.log).image.same_state(wrapped.image)


def test_a_large_registration_is_decided_again_after_the_begin_marker() -> None:
    """A registration's epoch is its record's offset: with the begin marker in front, the
    epoch moves up by one, and it is still the offset of the record."""
    plain, wrapped = _cluster(min_isr=3), _cluster(min_isr=3)
    for c in (plain, wrapped):
        c.fence(1)  # broker 1 joins the ELR of every partition (ISR below MinISR)
    _limit(wrapped, max_batch_bytes=2000)
    expected = plain.submit(RegisterBroker(broker_id=1, incarnation_id="again"))
    base = wrapped.image.end_offset
    result = wrapped.submit(RegisterBroker(broker_id=1, incarnation_id="again"))
    assert _markers(result.records) == ["BeginTransactionRecord", "EndTransactionRecord"]
    assert result.records[1:-1] != expected.records  # the epoch differs...
    (offset,) = [
        base + i for i, r in enumerate(result.records) if isinstance(r, RegisterBrokerRecord)
    ]
    assert isinstance(result.response, RegisterBrokerResponse)
    assert isinstance(expected.response, RegisterBrokerResponse)
    assert result.response.broker_epoch == offset == expected.response.broker_epoch + 1
    assert wrapped.image.brokers[1].epoch == offset
    assert wrapped.image.partitions == plain.image.partitions  # ...nothing else does
    assert replay_log(LogReplay(), wrapped.log).image.same_state(wrapped.image)


def _create_all(c: Cluster, request: CreateTopic) -> tuple[list[MetadataRecord], object, int]:
    """Step a create and every slice it asks for; (records, last response, steps)."""
    result = c.step_one(request)
    records, steps = list(result.records), 1
    while result.follow_up is not None:
        assert isinstance(result.response, Ack)  # a placeholder: the driver holds the future
        result = c.step_one(result.follow_up)
        records.extend(result.records)
        steps += 1
    return records, result.response, steps


@pytest.mark.parametrize(
    "request_",
    [
        CreateTopic(name="big", partitions=20, replication_factor=2),
        CreateTopic(name="big", assignments=[[1 + i % 3, 1 + (i + 1) % 3] for i in range(20)]),
    ],
    ids=["striped", "explicit"],
)
def test_a_large_topic_is_created_in_slices_inside_one_transaction(
    request_: CreateTopic,
) -> None:
    whole, sliced = Cluster(), Cluster()
    for c in (whole, sliced):
        c.start(1, 2, 3)
    _limit(sliced, work_budget=7)
    expected = whole.submit(request_)
    base = sliced.image.end_offset
    records, response, steps = _create_all(sliced, request_)
    assert steps == 3  # 7 + 7 + 6 partitions
    assert isinstance(records[0], BeginTransactionRecord)
    assert records[0].name == "CreateTopic big"
    assert isinstance(records[-1], EndTransactionRecord)
    assert records[1:-1] == expected.records
    assert response == expected.response
    assert isinstance(response, CreateTopicResponse) and len(response.assignments) == 20
    assert sliced.image.end_offset == base + len(records)
    assert sliced.image.partitions == expected.state.image.partitions
    assert sliced.image.topics == expected.state.image.topics
    # Until the end marker a reader of the log sees no topic at all.
    held = replay_log(LogReplay(), sliced.log[:-1])
    assert "big" not in held.image.topics and held.transaction is not None
    assert replay_log(LogReplay(), sliced.log).image.same_state(sliced.image)


def test_slices_are_never_wrapped_again() -> None:
    c = Cluster()
    c.start(1, 2, 3)
    _limit(c, work_budget=7, max_batch_bytes=100)
    records, response, steps = _create_all(
        c, CreateTopic(name="big", partitions=20, replication_factor=3)
    )
    assert steps == 3 and isinstance(response, CreateTopicResponse)
    assert _markers(records) == ["BeginTransactionRecord", "EndTransactionRecord"]


def test_a_topic_within_one_slice_or_without_slicing_is_one_step() -> None:
    for rules in ({"work_budget": 20}, {"work_budget": None}):
        c = Cluster()
        c.start(1, 2, 3)
        _limit(c, **rules)
        result = c.submit(CreateTopic(name="t", partitions=20, replication_factor=3))
        assert result.follow_up is None and _markers(result.records) == []
        assert isinstance(result.records[0], TopicRecord)
        assert sum(isinstance(r, PartitionRecord) for r in result.records) == 20


def test_transaction_names_say_what_the_event_names() -> None:
    s = CreateTopicSlice(name="big", topic_id="x", partitions=2, min_isr=1, start=1)
    assert transaction_name(s) == "CreateTopic big"
    assert transaction_name(FenceBroker(broker_id=4)) == "FenceBroker 4"
    alter = AlterPartition(
        topic="t", partition=0, leader=1, broker_epoch=0, partition_epoch=0, isr=[]
    )
    assert transaction_name(alter) == "AlterPartition t"
    assert transaction_name(Tick()) == "Tick"


# --- operations on a broker's partitions, in slices ---------------------------------------


def _pair(min_isr: int = 2, partitions: int = 40) -> tuple[Cluster, Cluster]:
    """Two identical clusters of 4 brokers: one unbounded, one with a budget of 7."""
    whole, sliced = Cluster(), Cluster()
    for c in (whole, sliced):
        c.start(1, 2, 3, 4)
        c.create("t", partitions=partitions, replication_factor=3, min_isr=min_isr)
    _limit(whole, work_budget=None)
    _limit(sliced, work_budget=7)
    return whole, sliced


def _step_all(c: Cluster, event: Event) -> tuple[list[MetadataRecord], object, list[str]]:
    """One event and its continuations, one step each: (records, response, event kinds)."""
    result = c.step_one(event)
    records, kinds = list(result.records), [type(event).__name__]
    while result.follow_up is not None:
        assert isinstance(result.response, Ack)  # a placeholder until the last slice
        kinds.append(type(result.follow_up).__name__)
        result = c.step_one(result.follow_up)
        records.extend(result.records)
    return records, result.response, kinds


def _inner(records: list[MetadataRecord]) -> list[MetadataRecord]:
    assert isinstance(records[0], BeginTransactionRecord)
    assert isinstance(records[-1], EndTransactionRecord)
    assert _markers(records) == ["BeginTransactionRecord", "EndTransactionRecord"]
    return records[1:-1]


def test_a_fence_in_slices_writes_what_one_step_writes() -> None:
    whole, sliced = _pair()
    expected = whole.step_one(FenceBroker(broker_id=1))
    records, response, kinds = _step_all(sliced, FenceBroker(broker_id=1))
    assert records[0] == BeginTransactionRecord(name="FenceBroker 1")
    assert _inner(records) == expected.records
    assert kinds == ["FenceBroker"] + ["Continue"] * (30 // 7)  # broker 1 hosts 30
    assert response == expected.response == Ack()
    assert sliced.image.partitions == whole.image.partitions
    # No partition went leaderless (ISR 3 -> 2, MinISR 2): nothing for recovery to look at.
    assert sliced.state.idle
    assert not any(isinstance(r, UncleanRecoveryRecord) for r in records)


def test_an_unfence_in_slices_elects_where_one_step_does() -> None:
    whole, sliced = _pair(min_isr=3)
    for c in (whole, sliced):
        for b in (1, 2, 3):
            c.submit(FenceBroker(broker_id=b))  # broker 4 still leads some
    epoch = whole.epoch(1)
    expected = whole.step_one(UnfenceBroker(broker_id=1, broker_epoch=epoch))
    records, response, _ = _step_all(
        sliced, UnfenceBroker(broker_id=1, broker_epoch=sliced.epoch(1))
    )
    assert len(expected.records) > 7  # more than one slice of elections
    assert _inner(records) == expected.records
    assert response == Ack()
    assert sliced.image.partitions == whole.image.partitions


@pytest.mark.parametrize("via", ["request", "heartbeat"])
def test_a_controlled_shutdown_in_slices_answers_at_the_end(via: str) -> None:
    whole, sliced = _pair()

    def request(c: Cluster) -> Event:
        if via == "request":
            return ControlledShutdown(broker_id=2, broker_epoch=c.epoch(2))
        return BrokerHeartbeatRequest(
            broker_id=2, broker_epoch=c.epoch(2), metadata_offset=c.image.end_offset,
            want_shutdown=True,
        )  # fmt: skip

    expected = whole.step_one(request(whole))
    records, response, _ = _step_all(sliced, request(sliced))
    assert _inner(records) == expected.records
    assert response == expected.response
    if via == "request":
        assert response == ControlledShutdownResponse(can_stop=True)
    else:
        assert response == BrokerHeartbeatResponse(
            is_fenced=False, in_controlled_shutdown=True, should_shut_down=True
        )
    # Asked again: it leads nothing, and nothing is written.
    again = sliced.step_one(request(sliced))
    assert again.records == [] and again.follow_up is None


def test_a_controlled_shutdown_with_nobody_to_take_over_can_still_stop() -> None:
    """With brokers 3 and 4 fenced, broker 1's partitions have no active replica left to
    lead them: they go leaderless (leadership never stays with an inactive broker), and
    the sliced answer agrees with the unsliced one that broker 1 leads nothing."""
    whole, sliced = _pair()
    for c in (whole, sliced):
        c.submit(FenceBroker(broker_id=3))
        c.submit(FenceBroker(broker_id=4))
    expected = whole.step_one(ControlledShutdown(broker_id=1, broker_epoch=whole.epoch(1)))
    _, response, _ = _step_all(
        sliced, ControlledShutdown(broker_id=1, broker_epoch=sliced.epoch(1))
    )
    assert response == expected.response == ControlledShutdownResponse(can_stop=True)
    assert not any(p.leader == 1 for p in sliced.image.partitions_of(1))
    assert any(not p.has_leader for p in sliced.image.partitions_of(1))


def test_an_unclean_registration_in_slices_moves_every_elr_membership() -> None:
    whole, sliced = _pair(min_isr=3)
    for c in (whole, sliced):
        c.fence(1)  # broker 1 joins the ELR of its partitions (ISR below MinISR)
    whole_base = whole.image.end_offset
    expected = whole.step_one(RegisterBroker(broker_id=1, incarnation_id="again"))
    base = sliced.image.end_offset
    records, response, kinds = _step_all(
        sliced, RegisterBroker(broker_id=1, incarnation_id="again")
    )
    assert kinds[0] == "RegisterBroker" and set(kinds[1:]) == {"Continue"}
    assert isinstance(response, RegisterBrokerResponse) and not response.clean
    assert isinstance(expected.response, RegisterBrokerResponse)
    # The begin marker comes first, so the epoch (the record's offset) is one more.
    assert response.broker_epoch == base + 1
    assert expected.response.broker_epoch == whole_base
    assert isinstance(records[1], RegisterBrokerRecord)
    assert sliced.image.partitions == whole.image.partitions
    assert not any(1 in p.elr for p in sliced.image.partitions_of(1))
    assert replay_log(LogReplay(), sliced.log).image.same_state(sliced.image)


def test_a_large_backlog_is_queued_as_a_plan_and_drained_a_budget_per_step() -> None:
    """Broker 1 alone hosts 40 leaderless partitions (more than four budgets of 7): its
    re-registration queues its whole index as one plan, and each Tick evaluates 7."""
    c = Cluster()
    c.start(1, 2)
    c.create("solo", assignments=[[1]] * 40, min_isr=1)
    _limit(c, work_budget=7)
    c.fence(1)
    c.step_one(RegisterBroker(broker_id=1, incarnation_id="again"))  # unclean: LKELR
    while c.last is not None and c.last.follow_up is not None:
        c.step_one(c.last.follow_up)
    ticks = 0
    while not c.state.idle:
        c.step_one(Tick())
        ticks += 1
    assert ticks >= 40 // 7
    assert len(c.tracker.pending) == 40  # balanced: waiting for broker 1's answers


@pytest.mark.parametrize("op", ["FENCE", "CONTROLLED_SHUTDOWN"])
def test_a_continuation_skips_partitions_that_are_gone(op: str) -> None:
    """A slice re-reads its partitions from the image: one that no longer exists (a topic
    deleted meanwhile, once deletes exist) is skipped, the others are still changed (a
    controlled shutdown also reads them again to tell whether the broker still leads)."""
    from controller.core.broker_handlers import continue_op
    from controller.core.handler_result import BrokerOp, Continue
    from controller.core.work import PartitionPlan

    c = _cluster(partitions=4)
    c.fence(1)  # fenced: its partitions are leaderless or led by others, in its ELR
    plan = PartitionPlan((("t", (0, 1, 99, 2, 3)),))
    cont = Continue(BrokerOp[op], 2, plan, Ack())
    result = continue_op(c.image, cont, None, c.config)
    assert result.follow_up is None
    if op == "FENCE":
        assert result.response == Ack()
    else:  # its leaderships all moved
        assert result.response == ControlledShutdownResponse(can_stop=True)
    changed = {(r.topic, r.partition) for r in result.records}
    assert ("t", 99) not in changed and changed <= {("t", i) for i in range(4)}
    assert changed  # broker 2 left the ISRs it was in
    assert len(result.records) == len(changed)  # each once, the run read again or not
