"""The one event step: decide → replay → evaluate recovery → replay.

`step(state, event, now_ms, rules)` is the whole controller as a pure function. It
routes the event to its handler against the image, replays the handler's records
(yielding a `MetadataDelta`), evaluates unclean recoveries for what changed (and for
pending recoveries whose windows are due), replays the recovery records too, and
returns everything the caller needs: the records to append, the response to send once
they are durable, the next state, the log inspections to send, the next timer deadline
and the delta. A refused request raises its coded `MetactlError` and changes nothing.

The asyncio driver, the scenario runner, the history simulator, the test kit and the
property test all call this function; none of them re-implements any part of it.
No IO, no clock reads (time comes in as `now_ms`), no asyncio.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from controller.core.config import ControllerConfig
from controller.core.handlers import (
    HandlerResult,
    alter_partition,
    controlled_shutdown,
    create_topic,
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
from metadata_log.records import MetadataRecord, PartitionChangeRecord
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


Event = ControllerRequest | Tick


class Rules(msgspec.Struct, frozen=True):
    """What the step is configured with: the controller config and the recovery policies."""

    config: ControllerConfig
    policies: Mapping[str, RecoveryPolicy]

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
    records: list[MetadataRecord]  # the event's records, then the recoveries' records
    response: ControllerResponse
    state: ControllerState
    inspections: list[Inspection]
    next_deadline_ms: int | None
    delta: MetadataDelta  # what all of `records` changed
    recovery_records: int = 0  # how many records at the end came from recovery evaluation


def step(state: ControllerState, event: Event, now_ms: int, rules: Rules) -> StepResult:
    records, response, tracker = decide(state.image, state.tracker, event, now_ms, rules)
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
    return StepResult(
        records=records,
        response=response,
        state=ControllerState(image, recovery.tracker, frozenset()),
        inspections=recovery.inspections,
        next_deadline_ms=recovery.next_deadline_ms,
        delta=delta,
        recovery_records=len(recovery.records),
    )


def decide(
    image: ClusterImage,
    tracker: RecoveryTracker,
    event: Event,
    now_ms: int,
    rules: Rules,
) -> tuple[list[MetadataRecord], ControllerResponse, RecoveryTracker]:
    """Route one event to its handler: the records, the response and the soft state."""
    config = rules.config
    result: HandlerResult
    match event:
        case Tick():
            return [], Ack(), tracker
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
            result = create_topic(image, event, now_ms, config, frozenset(rules.policies))
        case ElectLeader(election_type="preferred"):
            result = elect_preferred(image, event, now_ms, config)
        case ElectLeader():
            records, tracker = manual_election(image, tracker, event, now_ms)
            change = records[-1]
            assert isinstance(change, PartitionChangeRecord)
            p = image.partitions[(event.topic, event.partition)]
            return records, partition_view(p, change), tracker
        case ReplicaLogInfo():
            return [], Ack(), record_answer(image, tracker, event)
        case _:
            raise InvalidRequestError(f"the controller does not handle {type(event).__name__}")
    return result.records, result.response, tracker


def touched(image: ClusterImage, delta: MetadataDelta) -> frozenset[TopicPartition]:
    """Leaderless partitions whose recovery status a delta may have changed: the ones it
    changed, and those hosted by a broker whose state changed (fenced, unfenced,
    registered), since broker activity decides the proactive trigger and who can answer."""
    offline = image.offline
    out = set(common(offline, delta.partitions))
    for broker_id in delta.brokers:
        out.update(common(offline, image.replicas_by_broker.get(broker_id, EMPTY_INDEX)))
    return frozenset(out)
