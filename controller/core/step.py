"""The one event step: decide → replay → evaluate recovery → replay.

`step(state, event, now_ms, rules)` is the whole controller as a pure function. It
routes the event to its handler against the image, replays the handler's records
(yielding a `MetadataDelta`), evaluates unclean recoveries for what changed (and for
pending recoveries whose windows are due), replays the recovery records too, and
returns everything the caller needs: the records to append, the response to send once
they are durable, the next state, the log inspections to send, the next timer deadline
and the delta. A refused request raises its coded `MetactlError` and changes nothing.
Last, the automatic leader balance (`controller.core.leader_balance`) notes what changed
for its schedule, and a Tick does the next slice of a due check (`StepResult.wake_ms`
says when the driver steps one).

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

from controller.core import lifecycle, validation
from controller.core.broker_handlers import (
    continue_op,
    controlled_shutdown,
    fence_broker,
    heartbeat,
    register_broker,
    unfence_broker,
)
from controller.core.config import ControllerConfig
from controller.core.controller_change import ControllerActivated, controller_change
from controller.core.handler_result import (
    ClearElrSlice,
    Continue,
    CreateTopicSlice,
    FollowUp,
    HandlerResult,
    ReassignSlice,
)
from controller.core.leader_balance import LeaderBalance, balance_step
from controller.core.lifecycle import Bootstrap, ElectPreferredGroup
from controller.core.partition_handlers import (
    alter_partition,
    alter_partitions,
    elect_preferred,
    partition_view,
)
from controller.core.recovery.policy import RecoveryPolicy
from controller.core.recovery.registry import require
from controller.core.recovery.tracker import (
    Inspection,
    RecoveryStep,
    RecoveryTracker,
    evaluate,
    manual_election,
    record_answer,
    take_due,
)
from controller.core.topic_handlers import create_topic, create_topic_slice
from controller.core.work import EMPTY_BACKLOG, EVERYTHING, WORK_BUDGET, Backlog, PartitionPlan
from metactl.errors import InvalidRequestError
from metadata_image.delta import MetadataDelta
from metadata_image.image import EMPTY_INDEX, ClusterImage, common
from metadata_image.replay import apply
from metadata_image.state import TopicPartition
from metadata_log.records import (
    MAX_BATCH_BYTES,
    BeginTransactionRecord,
    EndTransactionRecord,
    MetadataRecord,
    PartitionChangeRecord,
    encode_batch,
)
from protocol.messages.admin import (
    AlterConfigs,
    AlterPartitionReassignments,
    CreatePartitions,
    CreateTopic,
    DeleteTopic,
    ElectLeader,
    UnregisterBroker,
    UpdateFeature,
)
from protocol.messages.broker_controller import (
    AlterPartition,
    AlterPartitions,
    BrokerHeartbeatRequest,
    RegisterBroker,
)
from protocol.messages.internal import (
    Ack,
    ControlledShutdown,
    FenceBroker,
    ReplicaLogInfo,
    UnfenceBroker,
)
from protocol.messages.unions import ControllerRequest, ControllerResponse


class Tick(msgspec.Struct, frozen=True):
    """Time moved, or work is queued: timers (recovery windows) may be due and the
    recovery backlog gets its next slice. Decides nothing by itself."""


class LogInfoAnswers(msgspec.Struct, frozen=True, gc=False):
    """One broker's answers to one GetReplicaLogInfo, for many partitions: one event, so
    that a million inspections after an outage are not a million events. The service
    builds it from the broker's response (at most a work budget of partitions each)."""

    answers: tuple[ReplicaLogInfo, ...]


# An event is a request, a Tick, a batch of log-inspection answers, or the next slice of
# work larger than the budget (which only the controller submits to itself, from a
# StepResult's `follow_up`).
Event = (
    ControllerRequest
    | Tick
    | LogInfoAnswers
    | Bootstrap
    | ControllerActivated
    | ElectPreferredGroup
    | CreateTopicSlice
    | Continue
    | ClearElrSlice
    | ReassignSlice
)

CONTINUATIONS: Final = (CreateTopicSlice, Continue, ClearElrSlice, ReassignSlice)


class Rules(msgspec.Struct, frozen=True):
    """What the step is configured with: the controller config and the recovery policies,
    the largest batch the log takes (`max_batch_bytes`: an event whose records encode
    larger becomes a transaction) and the work budget (`controller.core.work`): how many
    partitions one event may change, create or evaluate (None: unbounded, everything in
    one step, as a test of the unsliced rules wants)."""

    config: ControllerConfig
    policies: Mapping[str, RecoveryPolicy]
    max_batch_bytes: int = MAX_BATCH_BYTES
    work_budget: int | None = WORK_BUDGET

    def __post_init__(self) -> None:
        require(self.policies, self.config.unclean_recovery_strategy)  # fail fast on a typo


class ControllerState(msgspec.Struct, frozen=True):
    """The image plus the controller's soft state.

    `backlog` holds the partitions whose recovery status may have changed and that are
    not evaluated yet (`controller.core.work.Backlog`); a fresh controller, or one that
    reverted to its committed image, starts with every leaderless partition in it.
    `hold` says a transaction is open and this state is the image before it (the driver
    steps events that arrive meanwhile against it): recovery evaluation then waits.
    """

    image: ClusterImage
    tracker: RecoveryTracker = RecoveryTracker()
    backlog: Backlog = EVERYTHING
    hold: bool = False
    # The automatic preferred-leader balance's schedule and check under way
    # (`controller.core.leader_balance`); a new state schedules a check.
    balance: LeaderBalance = LeaderBalance()

    def absorb(self, records: Sequence[MetadataRecord]) -> tuple[ControllerState, MetadataDelta]:
        """Replay records that did not come from a step (a test's or a tool's own), so that
        the next step evaluates what they changed."""
        image, delta = apply(self.image, records)
        backlog = queue_touched(self.backlog, image, delta, tracker=self.tracker)
        return msgspec.structs.replace(self, image=image, backlog=backlog), delta

    @property
    def idle(self) -> bool:
        """Nothing is queued for a later step (the driver steps Ticks until it is)."""
        return self.backlog.empty and not self.balance.busy


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
    follow_up: FollowUp | None = None
    encoded_bytes: int = 0  # len(encode_batch(records)), 0 without records
    # encode_batch(records), for the log to store as is; None where the records are too
    # many for one batch (a transaction the committer splits and encodes chunk by chunk:
    # holding a 100 MB encoding until it is durable would only cost memory).
    encoded: bytes | None = None

    @property
    def wake_ms(self) -> int | None:
        """When the driver steps the next Tick: the next recovery deadline or the leader
        balance's next check, whichever comes first."""
        balance = self.state.balance.wake_ms
        if balance is None or self.next_deadline_ms is None:
            return self.next_deadline_ms if balance is None else balance
        return min(balance, self.next_deadline_ms)


def step(state: ControllerState, event: Event, now_ms: int, rules: Rules) -> StepResult:
    """One event: decide, replay, evaluate recoveries (at most the work budget), replay.

    Transactions (KIP-868): the records of one event normally fit in one stored batch and
    commit atomically as one. When they encode larger than `rules.max_batch_bytes`, the
    step wraps them in `BeginTransactionRecord` ... `EndTransactionRecord`, so the driver
    may write them as several batches and readers apply them at the end marker only.
    Work larger than `rules.work_budget` partitions (a topic creation; a fence, unfence,
    controlled shutdown or unclean registration of a broker with many partitions) is done
    in slices: the first step opens the transaction and returns the next slice as
    `follow_up`, each continuation returns the one after, and the last closes the
    transaction. Recovery evaluation waits while a transaction is open: the slices queue
    their scope, and the steps after the end marker evaluate it, a budget at a time. The
    markers take offsets, so the step (not the driver) places them: broker epochs are
    offsets.
    """
    result = _step(state, event, now_ms, rules)
    if (
        result.encoded_bytes <= rules.max_batch_bytes
        or result.follow_up is not None
        or isinstance(event, CONTINUATIONS)  # already inside a transaction
    ):
        return result
    return _as_transaction(state, event, now_ms, rules, result)


def settle(state: ControllerState, event: Event, now_ms: int, rules: Rules) -> StepResult:
    """`event`, its continuations and the Ticks that drain the recovery backlog, stepped
    back to back at `now_ms`, as one result (records in log order; the last response).

    For callers that step synchronously with nothing to interleave (the scenario runner,
    the simulators, tests): the driver interleaves other events between the same steps.
    A refusal of the first step raises; nothing was stepped."""
    results = [step(state, event, now_ms, rules)]
    while True:
        last = results[-1]
        if last.follow_up is not None:
            results.append(step(last.state, last.follow_up, now_ms, rules))
        elif not last.state.idle:
            results.append(step(last.state, Tick(), now_ms, rules))
        else:
            break
    if len(results) == 1:
        return results[0]
    delta = MetadataDelta()
    for r in results:
        delta.update(r.delta)
    last = results[-1]
    return StepResult(
        records=[rec for r in results for rec in r.records],
        # The answer of the step that ended the event's work (the first, or the last
        # continuation of the transaction it opened).
        response=next(r.response for r in results if r.follow_up is None),
        state=last.state,
        inspections=[i for r in results for i in r.inspections],
        next_deadline_ms=last.next_deadline_ms,
        delta=delta,
        # Only steps outside a transaction evaluate: the first (when it opened none) and
        # the Ticks after it, whose records come last.
        recovery_records=sum(r.recovery_records for r in results),
        encoded_bytes=sum(r.encoded_bytes for r in results),
    )


def _step(state: ControllerState, event: Event, now_ms: int, rules: Rules) -> StepResult:
    budget = rules.work_budget
    inside = isinstance(event, CONTINUATIONS)
    records, response, tracker, follow_up = decide(state.image, state.tracker, event, now_ms, rules)
    if follow_up is not None and not inside:
        # It opens a transaction, whose begin marker goes first.
        begin: list[MetadataRecord] = [BeginTransactionRecord(name=transaction_name(event))]
        if isinstance(event, RegisterBroker):
            # A registration's record carries its own offset (the broker epoch): decide
            # again with the marker in place. Nothing else a handler writes depends on
            # offsets.
            begun, _ = apply(state.image, begin)
            records, response, tracker, follow_up = decide(
                begun, state.tracker, event, now_ms, rules
            )
        records = begin + records
    if records:
        image, delta = apply(state.image, records)
    else:
        image, delta = state.image, MetadataDelta()
    backlog = state.backlog
    scope: Sequence[TopicPartition] = ()
    if follow_up is not None or inside or state.hold:
        # A transaction is open: nothing is evaluated until its end marker. Its changes
        # all lie in the scope its first step queues (the broker's partitions), or are
        # new partitions that have a leader (a created topic).
        if not isinstance(event, Continue):
            # (A broker operation's continuation queues its broker's scope at its end.)
            backlog = queue_touched(backlog, image, delta, budget, tracker)
        recovery = RecoveryStep(
            records=[], tracker=tracker, inspections=[], next_deadline_ms=tracker.next_wake
        )
    else:
        due, tracker = take_due(tracker, now_ms)
        backlog = backlog.resolve(state.image, tracker.offline, tracker.pending)
        if tracker.answered:
            # Answered partitions first, within the budget like the rest.
            backlog = backlog.first(sorted(tracker.answered))
            tracker = msgspec.structs.replace(tracker, answered=frozenset())
        backlog = queue_touched(backlog, image, delta, budget, tracker).with_partitions(due)
        scope, backlog = backlog.take(budget, image.offline)
        if scope:
            recovery = evaluate(
                image, tracker, now_ms, policies=rules.policies, config=rules.config, scope=scope
            )
        else:
            # Nothing to look at (most events: a heartbeat; the answered partitions were
            # put first in the scope): the pass would hand the tracker back as it is.
            recovery = RecoveryStep(
                records=[], tracker=tracker, inspections=[], next_deadline_ms=tracker.next_wake
            )
    if recovery.records:
        image, more = apply(image, recovery.records)
        delta.update(more)
        records = records + recovery.records
    # The automatic leader balance: its schedule notes every step; a Tick outside any
    # transaction, with no recovery work in it, does the next slice of a due check.
    balance, balanced = balance_step(
        state.balance, image, delta, now_ms=now_ms, config=rules.config, budget=budget,
        may_elect=isinstance(event, Tick) and not state.hold and not scope,
    )  # fmt: skip
    if balanced:
        image, more = apply(image, balanced)
        delta.update(more)
        records = records + balanced
        backlog = queue_touched(backlog, image, more, budget, recovery.tracker)
    if follow_up is None and inside:
        if isinstance(event, Continue):
            backlog = _queue_broker(backlog, image, event.broker_id, budget)
        end: list[MetadataRecord] = [EndTransactionRecord()]
        image, more = apply(image, end)
        delta.update(more)
        records = records + end
    encoded = encode_batch(records) if records else b""
    return StepResult(
        records=records,
        response=response,
        state=ControllerState(image, recovery.tracker, backlog, state.hold, balance),
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
        result = _step(msgspec.structs.replace(state, image=begun), event, now_ms, rules)
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
        state=msgspec.structs.replace(result.state, image=image, hold=state.hold),
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
) -> tuple[list[MetadataRecord], ControllerResponse, RecoveryTracker, FollowUp | None]:
    """Route one event to its handler: the records, the response, the soft state and the
    continuation of work larger than the budget."""
    config = rules.config
    budget = rules.work_budget
    result: HandlerResult
    match event:
        case Tick():
            return [], Ack(), tracker, None
        case BrokerHeartbeatRequest():
            result = heartbeat(image, event, now_ms, config, budget)
        case RegisterBroker():
            result = register_broker(image, event, now_ms, config, budget)
        case FenceBroker():
            result = fence_broker(image, event, now_ms, config, budget)
        case UnfenceBroker():
            result = unfence_broker(image, event, now_ms, config, budget)
        case ControlledShutdown():
            result = controlled_shutdown(image, event, now_ms, config, budget)
        case Continue():
            result = continue_op(image, event, budget, config)
        case AlterPartition():
            result = alter_partition(image, event, now_ms, config)
        case AlterPartitions():
            result = alter_partitions(image, event, now_ms, config, budget)
        case CreateTopic():
            result = create_topic(
                image,
                event,
                now_ms,
                config,
                frozenset(rules.policies),
                slice_partitions=budget,
            )
        case CreateTopicSlice():
            result = create_topic_slice(image, event, budget)
        case DeleteTopic():
            result = lifecycle.delete_topic(image, event)
        case CreatePartitions():
            result = lifecycle.create_partitions(image, event, config, budget)
        case AlterConfigs():
            result = lifecycle.alter_configs(image, event, config, budget)
        case UpdateFeature():
            result = lifecycle.update_feature(image, event, config, budget)
        case ClearElrSlice():
            result = lifecycle.clear_elr_slice(event, budget)
        case AlterPartitionReassignments():
            result = lifecycle.alter_reassignments(image, event, config, budget)
        case ReassignSlice():
            result = lifecycle.reassign_slice(image, event, config, budget)
        case UnregisterBroker():
            result = lifecycle.unregister_broker(image, event, config, budget)
        case Bootstrap():
            result = lifecycle.bootstrap(image, config)
        case ControllerActivated():
            result = controller_change(event)
        case ElectPreferredGroup():
            result = lifecycle.elect_preferred_group(image, event, config)
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
        case LogInfoAnswers():
            for answer in event.answers:  # all valid, or none is taken
                validation.check_replica_log_info(answer)
            for answer in event.answers:
                tracker = record_answer(image, tracker, answer)
            return [], Ack(), tracker, None
        case _:
            raise InvalidRequestError(f"the controller does not handle {type(event).__name__}")
    return result.records, result.response, tracker, result.follow_up


# A broker's offline partitions are queued one by one while there are at most this many
# budgets of offline partitions in all (probing each in the broker's index); beyond that,
# the broker's whole plan is queued (its online partitions are then looked at and
# skipped, a budget per step, rather than probed all in one step).
_PROBE_BUDGETS: Final = 4


def queue_touched(
    backlog: Backlog,
    image: ClusterImage,
    delta: MetadataDelta,
    budget: int | None = WORK_BUDGET,
    tracker: RecoveryTracker | None = None,
) -> Backlog:
    """`backlog` plus the partitions whose recovery status `delta` may have changed: the
    ones it changed that are leaderless or known to the tracker (a note, a pending
    recovery or a wake-up, which a leader ends), and the leaderless ones hosted by a
    broker whose state changed (fenced, unfenced, registered), since broker activity
    decides the proactive trigger and who can answer. Costs O(changed partitions +
    offline partitions of each changed broker), never a walk of all partitions."""
    if delta.partitions:
        offline = image.offline
        if tracker is None:
            backlog = backlog.with_partitions(delta.partitions)
        else:
            notes, pending, wakes = tracker.offline, tracker.pending, tracker.wake_of
            if offline or notes or pending or wakes:  # else none is queued: no probes
                backlog = backlog.with_partitions(
                    tp
                    for tp in delta.partitions
                    if tp in offline or tp in notes or tp in pending or tp in wakes
                )
    if delta.features:
        # The rules changed (eligible.leader.replicas.version): every leaderless partition
        # and every recovery the tracker knows is looked at again, as after a restart
        # (`Backlog.resolve` of EVERYTHING; a budget at a time, as any backlog).
        noted = (tracker.offline, tracker.pending) if tracker is not None else ()
        backlog = backlog.then(EVERYTHING.resolve(image, *noted))
    if delta.removed_topics and tracker is not None:
        # A deleted topic's recoveries and notes end: the next looks find them gone.
        gone = delta.removed_topics
        backlog = backlog.with_partitions(
            tp
            for known in (tracker.offline, tracker.pending, tracker.wake_of)
            for tp in known
            if tp[0] in gone
        )
    for broker_id in delta.brokers:
        backlog = _queue_broker(backlog, image, broker_id, budget)
    return backlog


def _queue_broker(
    backlog: Backlog, image: ClusterImage, broker_id: int, budget: int | None
) -> Backlog:
    offline = image.offline
    if not offline:
        return backlog
    index = image.replicas_by_broker.get(broker_id, EMPTY_INDEX)
    probe = _PROBE_BUDGETS * budget if budget is not None else len(offline)
    if len(offline) <= probe or len(index) <= probe:
        return backlog.with_partitions(common(offline, index))
    return backlog.with_plan(PartitionPlan.of_index(index))


def touched(image: ClusterImage, delta: MetadataDelta) -> frozenset[TopicPartition]:
    """The leaderless partitions `queue_touched` would queue for `delta` (for tests)."""
    offline = image.offline
    queued = queue_touched(EMPTY_BACKLOG, image, delta)
    return frozenset(tp for tp in queued if tp in offline)
