"""The one event step: decide → replay → evaluate recovery → replay.

`step(state, event, now_ms, rules)` is the whole controller as a pure function. It
routes the event to its handler against the image, replays the handler's records
(yielding a `MetadataDelta`), evaluates unclean recoveries for what changed (and for
pending recoveries whose windows are due), replays the recovery records too, and
returns everything the caller needs: the records to append, the response to send once
they are durable, the next state, the log inspections to send, the next timer deadline
and the delta. A refused request raises its coded `MetactlError` and changes nothing.

The step also decides transactions (KIP-868, see `step`): where the begin and end
markers go when an event's records are too large for one stored batch, and how a large
topic creation is cut into slices (`StepResult.follow_up`). The driver only writes the
records it is given, in batches, and yields between slices.

The asyncio driver, the scenario runner, the history simulator, the test kit and the
property test all call this function; none of them re-implements any part of it.
No IO, no clock reads (time comes in as `now_ms`), no asyncio.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import msgspec

from controller.core import validation
from controller.core.config import ControllerConfig
from controller.core.handlers import (
    CreateTopicSlice,
    HandlerResult,
    alter_partition,
    controlled_shutdown,
    create_topic,
    create_topic_slice,
    elect_preferred,
    fence_broker,
    heartbeat,
    partition_view,
    register_broker,
    unfence_broker,
)
from controller.core.recovery.policy import RecoveryPolicy
from controller.core.recovery.registry import require
from controller.core.recovery.tracker import (
    Inspection,
    RecoveryTracker,
    evaluate,
    manual_election,
    record_answer,
)
from metactl.errors import InvalidRequestError
from metadata_image.delta import MetadataDelta
from metadata_image.image import EMPTY_INDEX, ClusterImage, TopicPartition, common
from metadata_image.replay import apply
from metadata_log.records import (
    MAX_BATCH_BYTES,
    BeginTransactionRecord,
    EndTransactionRecord,
    MetadataRecord,
    PartitionChangeRecord,
    encode_batch,
)
from protocol.messages import (
    Ack,
    AlterPartition,
    BrokerHeartbeatRequest,
    ControlledShutdown,
    ControllerRequest,
    ControllerResponse,
    CreateTopic,
    ElectLeader,
    FenceBroker,
    RegisterBroker,
    ReplicaLogInfo,
    UnfenceBroker,
)


class Tick(msgspec.Struct, frozen=True):
    """Time moved: timers (recovery windows) may be due. Decides nothing by itself."""


# An event is a request, a Tick, or the next slice of a topic created in slices (which
# only the controller submits to itself, from a StepResult's `follow_up`).
Event = ControllerRequest | Tick | CreateTopicSlice

CREATE_SLICE_PARTITIONS: Final = 1_000
"""Partitions per slice of a large topic creation: 5 to 20 ms of step each (bench/
large_cluster.py), so the driver answers heartbeats and describes between slices."""


class Rules(msgspec.Struct, frozen=True):
    """What the step is configured with: the controller config and the recovery policies,
    the largest batch the log takes (`max_batch_bytes`: an event whose records encode
    larger becomes a transaction) and the slice size of a large topic creation (None:
    never sliced; the driver slices by `CREATE_SLICE_PARTITIONS`, callers that step
    synchronously, like the simulators, need not)."""

    config: ControllerConfig
    policies: Mapping[str, RecoveryPolicy]
    max_batch_bytes: int = MAX_BATCH_BYTES
    create_slice_partitions: int | None = None

    def __post_init__(self) -> None:
        require(self.policies, self.config.unclean_recovery_strategy)  # fail fast on a typo


class ControllerState(msgspec.Struct, frozen=True):
    """The image plus the controller's soft state.

    `dirty` holds the partitions whose recovery status may have changed since the last
    evaluation; None asks for a look at every leaderless partition (a fresh controller,
    or one that reverted to its committed image).
    """

    image: ClusterImage
    tracker: RecoveryTracker = RecoveryTracker()
    dirty: frozenset[TopicPartition] | None = None

    def absorb(self, records: Sequence[MetadataRecord]) -> tuple[ControllerState, MetadataDelta]:
        """Replay records that did not come from a step (a test's or a tool's own), so that
        the next step evaluates what they changed."""
        image, delta = apply(self.image, records)
        dirty = None if self.dirty is None else self.dirty | touched(image, delta)
        return ControllerState(image, self.tracker, dirty), delta


class StepResult(msgspec.Struct, frozen=True):
    # The event's records, then the recoveries' records; inside transaction markers when
    # the step opens or closes a transaction (see `step`).
    records: list[MetadataRecord]
    response: ControllerResponse
    state: ControllerState
    inspections: list[Inspection]
    next_deadline_ms: int | None
    delta: MetadataDelta  # what all of `records` changed
    # How many records at the end (before an EndTransactionRecord) came from recovery
    # evaluation.
    recovery_records: int = 0
    # The transaction stays open: the driver steps this next, before any other event that
    # writes records, and releases the response of the last slice only.
    follow_up: CreateTopicSlice | None = None
    encoded_bytes: int = 0  # len(encode_batch(records)), 0 without records
    # encode_batch(records), for the log to store as is; None where the records are too
    # many for one batch (a transaction the committer splits and encodes chunk by chunk:
    # holding a 100 MB encoding until it is durable would only cost memory).
    encoded: bytes | None = None


def step(state: ControllerState, event: Event, now_ms: int, rules: Rules) -> StepResult:
    """One event: decide, replay, evaluate recoveries, replay.

    Transactions (KIP-868): the records of one event normally fit in one stored batch and
    commit atomically as one. When they encode larger than `rules.max_batch_bytes`, the
    step wraps them in `BeginTransactionRecord` ... `EndTransactionRecord`, so the driver
    may write them as several batches and readers apply them at the end marker only. A
    topic of more than `rules.create_slice_partitions` partitions is created in slices:
    the first step opens the transaction and returns the next slice as `follow_up`, the
    last slice's step closes it. The markers take offsets, so the step (not the driver)
    places them: broker epochs are offsets.
    """
    result = _step(state, event, now_ms, rules)
    if (
        result.encoded_bytes <= rules.max_batch_bytes
        or result.follow_up is not None
        or isinstance(event, CreateTopicSlice)  # already inside a transaction
    ):
        return result
    return _as_transaction(state, event, now_ms, rules, result)


def _step(state: ControllerState, event: Event, now_ms: int, rules: Rules) -> StepResult:
    records, response, tracker, follow_up = decide(state.image, state.tracker, event, now_ms, rules)
    if follow_up is not None and not isinstance(event, CreateTopicSlice):
        records = [BeginTransactionRecord(name=transaction_name(event)), *records]
    if records:
        image, delta = apply(state.image, records)
    else:
        image, delta = state.image, MetadataDelta()
    scope = None if state.dirty is None else state.dirty | touched(image, delta)
    recovery = evaluate(
        image, tracker, now_ms, policies=rules.policies, config=rules.config, touched=scope
    )
    if recovery.records:
        image, more = apply(image, recovery.records)
        delta.update(more)
        records = records + recovery.records
    if follow_up is None and isinstance(event, CreateTopicSlice):
        end: list[MetadataRecord] = [EndTransactionRecord()]
        image, more = apply(image, end)
        delta.update(more)
        records = records + end
    encoded = encode_batch(records) if records else b""
    return StepResult(
        records=records,
        response=response,
        state=ControllerState(image, recovery.tracker, frozenset()),
        inspections=recovery.inspections,
        next_deadline_ms=recovery.next_deadline_ms,
        delta=delta,
        recovery_records=len(recovery.records),
        follow_up=follow_up,
        encoded_bytes=len(encoded),
        encoded=encoded,
    )


def _as_transaction(
    state: ControllerState, event: Event, now_ms: int, rules: Rules, result: StepResult
) -> StepResult:
    """`result`, whose records are too large for one batch, as one transaction."""
    begin: list[MetadataRecord] = [BeginTransactionRecord(name=transaction_name(event))]
    begun, delta = apply(state.image, begin)
    if isinstance(event, RegisterBroker):
        # A registration's record carries its own offset (the broker epoch): decide again
        # with the begin marker in place.
        result = _step(ControllerState(begun, state.tracker, state.dirty), event, now_ms, rules)
        image = result.state.image
    else:
        # Nothing else a handler writes depends on offsets: the records move up by one.
        after = result.state.image
        image = msgspec.structs.replace(after, end_offset=after.end_offset + 1)
    end: list[MetadataRecord] = [EndTransactionRecord()]
    image, more = apply(image, end)
    delta.update(result.delta).update(more)
    records = [*begin, *result.records, *end]
    return StepResult(
        records=records,
        response=result.response,
        state=ControllerState(image, result.state.tracker, result.state.dirty),
        inspections=result.inspections,
        next_deadline_ms=result.next_deadline_ms,
        delta=delta,
        recovery_records=result.recovery_records,
        encoded_bytes=result.encoded_bytes + len(encode_batch(begin + end)),
    )


def transaction_name(event: Event) -> str:
    """What a transaction does, for people reading the log: the event and what it names."""
    kind = "CreateTopic" if isinstance(event, CreateTopicSlice) else type(event).__name__
    for attr in ("name", "topic", "broker_id"):
        value = getattr(event, attr, None)
        if value is not None:
            return f"{kind} {value}"
    return kind


def decide(
    image: ClusterImage,
    tracker: RecoveryTracker,
    event: Event,
    now_ms: int,
    rules: Rules,
) -> tuple[list[MetadataRecord], ControllerResponse, RecoveryTracker, CreateTopicSlice | None]:
    """Route one event to its handler: the records, the response, the soft state and the
    next slice of a topic created in slices."""
    config = rules.config
    result: HandlerResult
    match event:
        case Tick():
            return [], Ack(), tracker, None
        case BrokerHeartbeatRequest():
            result = heartbeat(image, event, now_ms, config)
        case RegisterBroker():
            result = register_broker(image, event, now_ms, config)
        case FenceBroker():
            result = fence_broker(image, event, now_ms, config)
        case UnfenceBroker():
            result = unfence_broker(image, event, now_ms, config)
        case ControlledShutdown():
            result = controlled_shutdown(image, event, now_ms, config)
        case AlterPartition():
            result = alter_partition(image, event, now_ms, config)
        case CreateTopic():
            result = create_topic(
                image,
                event,
                now_ms,
                config,
                frozenset(rules.policies),
                slice_partitions=rules.create_slice_partitions,
            )
        case CreateTopicSlice():
            result = create_topic_slice(image, event, rules.create_slice_partitions)
        case ElectLeader(election_type="preferred"):
            result = elect_preferred(image, event, now_ms, config)
        case ElectLeader():
            validation.check_elect_leader(event)
            records, tracker = manual_election(image, tracker, event, now_ms)
            change = records[-1]
            assert isinstance(change, PartitionChangeRecord)
            p = image.partitions[(event.topic, event.partition)]
            return records, partition_view(p, change), tracker, None
        case ReplicaLogInfo():
            validation.check_replica_log_info(event)
            return [], Ack(), record_answer(image, tracker, event), None
        case _:
            raise InvalidRequestError(f"the controller does not handle {type(event).__name__}")
    return result.records, result.response, tracker, result.follow_up


def touched(image: ClusterImage, delta: MetadataDelta) -> frozenset[TopicPartition]:
    """Leaderless partitions whose recovery status a delta may have changed: the ones it
    changed, and those hosted by a broker whose state changed (fenced, unfenced,
    registered), since broker activity decides the proactive trigger and who can answer."""
    offline = image.offline
    out = set(common(offline, delta.partitions))
    for broker_id in delta.brokers:
        out.update(common(offline, image.replicas_by_broker.get(broker_id, EMPTY_INDEX)))
    return frozenset(out)
