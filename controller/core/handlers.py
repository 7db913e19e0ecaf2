"""Pure request handlers: `(image, request, now_ms, config) -> HandlerResult`.

A handler reads the image, validates the request and returns the records that carry
out the rules, plus the response to send once they are durable. Every field is first
checked against the range Kafka gives it (`controller.core.validation`). It changes nothing:
the driver appends the records and `replay` applies them. Errors are raised as coded
`MetactlError`s before any record is produced, so a refused request leaves no trace.

Rules 1-6, 8 and 9 of the controller issue live here (rule 1 through
`partition_change`); rule 7, unclean recovery, lives in `controller.core.recovery`.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterable
from typing import Final

import msgspec

from controller.core import validation
from controller.core.config import ControllerConfig
from controller.core.partition_change import (
    build_change,
    complete_reassignment,
    remove_from_isrs,
    without_broker,
)
from controller.core.work import PartitionPlan
from metactl.errors import (
    BrokerIdNotRegisteredError,
    DuplicateBrokerRegistrationError,
    ElectionNotNeededError,
    FencedLeaderEpochError,
    IneligibleReplicaError,
    InvalidReplicaAssignmentError,
    InvalidRequestError,
    InvalidUpdateVersionError,
    MetactlError,
    NotLeaderOrFollowerError,
    PreferredLeaderNotAvailableError,
    StaleBrokerEpochError,
    TopicAlreadyExistsError,
    UnknownRecoveryPolicyError,
    UnknownTopicOrPartitionError,
)
from metadata_image.image import ClusterImage, PartitionState
from metadata_image.replay import replay
from metadata_log.records import (
    NO_LEADER,
    BrokerRegistrationChangeRecord,
    ChangeReason,
    ElectionKind,
    FenceBrokerRecord,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
)
from protocol.messages import (
    Ack,
    AlterPartition,
    AlterPartitionResult,
    AlterPartitions,
    AlterPartitionsResponse,
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    ControlledShutdown,
    ControlledShutdownResponse,
    ControllerResponse,
    CreateTopic,
    CreateTopicResponse,
    ElectLeader,
    FenceBroker,
    PartitionView,
    Reassignment,
    ReassignmentResult,
    RegisterBroker,
    RegisterBrokerResponse,
    UnfenceBroker,
)

# Topic ids are random UUIDs the driver draws for each CreateTopic (the event carries it,
# so handlers stay pure); callers without randomness get one derived from name and offset.
_TOPIC_ID_NAMESPACE: Final = uuid.UUID("5f1b2a3c-0966-4e6d-8a11-6d657461637c")


class CreateTopicSlice(msgspec.Struct, frozen=True, gc=False):
    """The rest of a topic created in slices: partitions [start, partitions) are still to be
    written, inside the transaction the first slice opened (`create_topic`).

    An event for `controller.core.step.step` that only the controller submits to itself,
    never the wire. Everything a slice needs was decided and validated by the first one:
    the topic id, the effective min ISR and the placement (`assignments` when explicit,
    else striped over `brokers`). `placed` keeps the striped assignments written so far,
    for the response of the last slice.
    """

    name: str
    topic_id: str
    partitions: int
    min_isr: int
    start: int
    assignments: list[list[int]] | None = None  # explicit, from partition `first` on
    brokers: tuple[int, ...] = ()
    replication_factor: int = 0
    placed: tuple[list[list[int]], ...] = ()
    first: int = 0  # the partition `assignments[0]` is for (add partitions: the old count)


class BrokerOp(enum.Enum):
    """What a `Continue` does to each partition of its broker."""

    FENCE = "fence"  # leave the ISR (rule 2), re-elect where it led
    CONTROLLED_SHUTDOWN = "controlled_shutdown"  # the same, as rule 5
    UNFENCE = "unfence"  # elect where its ELR/ISR membership makes it possible (rule 4)
    UNCLEAN_REGISTRATION = "unclean_registration"  # ELR -> LastKnownELR (rule 3)
    UNREGISTER = "unregister"  # leave every ISR, ELR and LastKnownELR (KIP-966)


class Continue(msgspec.Struct, frozen=True, gc=False):
    """The rest of an operation on one broker's partitions, stepped after its first slice
    inside the transaction that slice opened (see `controller.core.work`).

    An event for `controller.core.step.step` that only the controller submits to itself,
    never the wire. The broker-level record was written by the first slice; each
    continuation writes the partition changes of the next `WORK_BUDGET` partitions of
    `plan` (re-reading each partition from the image, so the changes are exactly those
    the unsliced operation would write). `response` is the operation's answer, released
    after the last slice; for a controlled shutdown `still_leads` accumulates whether the
    broker still leads a partition once its changes apply.
    """

    op: BrokerOp
    broker_id: int
    plan: PartitionPlan
    response: ControllerResponse
    still_leads: bool = False


class ClearElrSlice(msgspec.Struct, frozen=True, gc=False):
    """The rest of a clearing (a min.insync.replicas change or an ELR downgrade): the
    topics still to clear, each with its partition count and new configured MinISR (None:
    unchanged), from partition `start` of the first. An event only the controller
    submits to itself, inside the transaction its first slice opened."""

    topics: tuple[tuple[str, int, int | None], ...]
    start: int
    response: ControllerResponse


class ReassignSlice(msgspec.Struct, frozen=True, gc=False):
    """The rest of an AlterPartitionReassignments: the partitions from `position` on,
    and the results so far."""

    reassignments: tuple[Reassignment, ...]
    position: int
    results: tuple[ReassignmentResult, ...]


FollowUp = CreateTopicSlice | Continue | ClearElrSlice | ReassignSlice


class HandlerResult(msgspec.Struct, frozen=True):
    records: list[MetadataRecord]
    response: ControllerResponse
    # Work larger than the budget: the continuation to step next (the response is then a
    # placeholder; the last continuation's response is the request's).
    follow_up: FollowUp | None = None


class _Txn:
    """Records of one request, with the broker-level ones applied to a provisional image
    so that the partition changes that follow see the broker's new state."""

    def __init__(self, image: ClusterImage) -> None:
        self.base_offset = image.end_offset
        self.image = image
        self.records: list[MetadataRecord] = []
        self.changes: list[PartitionChangeRecord] = []

    @property
    def next_offset(self) -> int:
        return self.base_offset + len(self.records)

    def broker_record(self, record: MetadataRecord) -> None:
        # Partition changes queued so far do not touch broker state, so replaying only
        # the broker record onto the provisional image is exact for what follows.
        self.image = replay(self.image, (record,))
        self.records.append(record)

    def partition_changes(self, changes: Iterable[PartitionChangeRecord | None]) -> None:
        kept = [c for c in changes if c is not None]
        self.records += kept
        self.changes += kept


def _require_broker(image: ClusterImage, broker_id: int, epoch: int | None = None) -> None:
    b = image.broker(broker_id)
    if b is None:
        raise BrokerIdNotRegisteredError(f"broker {broker_id} is not registered")
    if epoch is not None and epoch != b.epoch:
        raise StaleBrokerEpochError(
            f"broker {broker_id} presented epoch {epoch}, the current epoch is {b.epoch}"
        )


def _require_partition(image: ClusterImage, topic: str, partition: int) -> PartitionState:
    p = image.partition((topic, partition))
    if p is None:
        raise UnknownTopicOrPartitionError(f"unknown partition {topic}-{partition}")
    return p


def _fence_changes(
    txn: _Txn, broker_id: int, reason: ChangeReason, config: ControllerConfig
) -> None:
    """Rule 2 / rule 5: leave every ISR (classic rules: but the last); re-elect where the
    broker led. Unsliced: used where the broker is in few ISRs (retiring an incarnation
    that is already in controlled shutdown)."""
    txn.partition_changes(
        remove_from_isrs(
            txn.image,
            broker_id,
            reason=reason,
            elr_enabled=txn.image.elr_enabled(config.eligible_leader_replicas),
        )
    )


_OP_REASONS: Final = {
    BrokerOp.FENCE: ChangeReason.FENCE,
    BrokerOp.CONTROLLED_SHUTDOWN: ChangeReason.CONTROLLED_SHUTDOWN,
    BrokerOp.UNFENCE: ChangeReason.UNFENCE,
    BrokerOp.UNCLEAN_REGISTRATION: ChangeReason.UNCLEAN_REGISTRATION,
    BrokerOp.UNREGISTER: ChangeReason.UNREGISTER,
}


def _op_changes(
    image: ClusterImage,
    op: BrokerOp,
    broker_id: int,
    groups: list[tuple[str, tuple[int, ...]]],
    config: ControllerConfig,
) -> list[PartitionChangeRecord]:
    """The changes `op` makes to the partitions of `groups` (runs of the broker's), in
    `image`, where the broker-level record is already applied."""
    reason = _OP_REASONS[op]
    elr = image.elr_enabled(config.eligible_leader_replicas)
    if op is BrokerOp.FENCE or op is BrokerOp.CONTROLLED_SHUTDOWN:
        return remove_from_isrs(image, broker_id, reason=reason, elr_enabled=elr, groups=groups)
    partitions = _present(image, groups)
    if op is BrokerOp.UNREGISTER:
        return without_broker(image, broker_id, partitions, elr_enabled=elr)
    out: list[PartitionChangeRecord] = []
    for p in partitions:
        if op is BrokerOp.UNFENCE:
            if p.leader != NO_LEADER or (broker_id not in p.elr and broker_id not in p.isr):
                continue
            if elr and broker_id in p.isr and not image.brokers[broker_id].last_registration_clean:
                # An ISR the classic rules left it in, and an unclean registration under
                # them, before an upgrade: with the ELR on it is no clean leader. Unclean
                # Exclusion applies now, as at a registration under KIP-966's rules (an
                # unclean registration with the ELR on leaves no ISR membership behind,
                # and a fenced broker cannot rejoin one, so nothing else reaches here).
                change = build_change(
                    image,
                    p,
                    reason=ChangeReason.UNCLEAN_REGISTRATION,
                    target_isr=p.isr - {broker_id},
                    unclean_excluded=frozenset((broker_id,)),
                    broker=broker_id,
                )
            else:
                change = build_change(image, p, reason=reason, broker=broker_id, elr_enabled=elr)
        else:  # UNCLEAN_REGISTRATION
            # KIP-966's Unclean Exclusion (Kafka since KAFKA-18106): with the ELR on, the
            # broker leaves every ISR and ELR it is in, whatever put it there (an ISR the
            # classic rules left it in before an upgrade, or before an unregistration);
            # where rule 1 would have kept it (the ISR falls below MinISR) it goes to the
            # LastKnownELR, and the partition waits for a recovery. With the ELR off the
            # classic rules stand: the last ISR member stays, and is elected again.
            in_isr = elr and broker_id in p.isr
            if broker_id not in p.elr and not in_isr:
                continue
            change = build_change(
                image,
                p,
                reason=reason,
                target_isr=p.isr - {broker_id} if in_isr else None,
                unclean_excluded=frozenset((broker_id,)),
                broker=broker_id,
                elr_enabled=elr,
            )
        if change is not None:
            out.append(change)
    return out


def _broker_slice(
    image: ClusterImage, c: Continue, budget: int | None, config: ControllerConfig
) -> tuple[list[PartitionChangeRecord], Continue]:
    """The changes of the next slice of `c`, and `c` after it (its plan advanced and, for
    a controlled shutdown, `still_leads` updated); the operation is done once the
    returned plan is."""
    groups, plan = c.plan.take_groups(budget if budget is not None else 1 << 62)
    changes = _op_changes(image, c.op, c.broker_id, groups, config)
    still = c.still_leads
    if c.op is BrokerOp.CONTROLLED_SHUTDOWN and not still:
        moved = {(ch.topic, ch.partition) for ch in changes if ch.leader is not None}
        still = any(p.leader == c.broker_id and p.tp not in moved for p in _present(image, groups))
    return changes, msgspec.structs.replace(c, plan=plan, still_leads=still)


def _present(
    image: ClusterImage, groups: list[tuple[str, tuple[int, ...]]]
) -> list[PartitionState]:
    """The partitions of `groups` that exist, read a topic's run at a time."""
    parts = image.partitions
    out: list[PartitionState] = []
    for topic, numbers in groups:
        try:
            run = list(parts.of_topic(topic, numbers))
        except KeyError:  # a partition gone meanwhile: read the run one by one
            run = [p for p in (parts.get((topic, i)) for i in numbers) if p is not None]
        out.extend(run)
    return out


def _final_response(c: Continue) -> ControllerResponse:
    """The operation's answer once every slice is written."""
    r = c.response
    if c.op is BrokerOp.CONTROLLED_SHUTDOWN:
        if isinstance(r, BrokerHeartbeatResponse):  # asked for by a heartbeat
            return msgspec.structs.replace(r, should_shut_down=not c.still_leads)
        return ControlledShutdownResponse(can_stop=not c.still_leads)
    return r


def _sliced(
    records: list[MetadataRecord], changes: list[PartitionChangeRecord], after: Continue
) -> HandlerResult:
    records = records + list(changes)
    if after.plan.done:
        return HandlerResult(records, _final_response(after))
    return HandlerResult(records, Ack(), after)


def _broker_op(
    txn: _Txn,
    op: BrokerOp,
    broker_id: int,
    response: ControllerResponse,
    *,
    config: ControllerConfig,
    budget: int | None,
) -> HandlerResult:
    """`op` on the broker's partitions after the broker record `txn` holds: the first
    slice now, the rest (if any) as the result's `follow_up`. `response` is what the
    operation answers (a controlled shutdown's `can_stop` is filled in at the end)."""
    c = Continue(op, broker_id, PartitionPlan.of_broker(txn.image, broker_id), response)
    changes, after = _broker_slice(txn.image, c, budget, config)
    return _sliced(txn.records, changes, after)


def continue_op(
    image: ClusterImage, c: Continue, budget: int | None, config: ControllerConfig
) -> HandlerResult:
    """The next slice of an operation a broker handler began (see `Continue`)."""
    changes, after = _broker_slice(image, c, budget, config)
    return _sliced([], changes, after)


def fence_broker(
    image: ClusterImage,
    req: FenceBroker,
    now_ms: int,
    config: ControllerConfig,
    budget: int | None = None,
) -> HandlerResult:
    """Rule 2, in slices of `budget` partitions (None: all at once)."""
    validation.check_fence_broker(req)
    _require_broker(image, req.broker_id)
    b = image.brokers[req.broker_id]
    if b.fenced:
        return HandlerResult([], Ack())
    txn = _Txn(image)
    txn.broker_record(
        FenceBrokerRecord(broker_id=b.broker_id, broker_epoch=b.epoch, reason=req.reason)
    )
    return _broker_op(txn, BrokerOp.FENCE, b.broker_id, Ack(), config=config, budget=budget)


def register_broker(
    image: ClusterImage,
    req: RegisterBroker,
    now_ms: int,
    config: ControllerConfig,
    budget: int | None = None,
) -> HandlerResult:
    """Rule 3. Clean only if the presented epoch equals the last registered one.

    A first registration of a broker that hosts no replicas counts as clean: it has no
    data it could have lost. Every other registration without a matching epoch is
    unclean and moves the broker's ELR memberships to the LastKnownELR.
    """
    validation.check_register_broker(req)
    existing = image.broker(req.broker_id)
    txn = _Txn(image)
    if existing is not None:
        if existing.incarnation_id == req.incarnation_id:
            # A retry of a registration that already took effect (the broker stays fenced
            # until it unfences, so a retry normally finds it fenced).
            return HandlerResult(
                [],
                RegisterBrokerResponse(
                    broker_epoch=existing.epoch, clean=existing.last_registration_clean
                ),
            )
        if not existing.fenced and not existing.in_controlled_shutdown:
            raise DuplicateBrokerRegistrationError(
                f"broker {req.broker_id} is registered and active with incarnation "
                f"{existing.incarnation_id} (epoch {existing.epoch}); "
                "wait for its session to expire"
            )
        if not existing.fenced:
            # Retire the old incarnation first (it was in controlled shutdown).
            txn.broker_record(
                FenceBrokerRecord(
                    broker_id=existing.broker_id,
                    broker_epoch=existing.epoch,
                    reason="reregistration",
                )
            )
            _fence_changes(txn, existing.broker_id, ChangeReason.FENCE, config)
        clean = req.previous_epoch is not None and req.previous_epoch == existing.epoch
    else:
        clean = not image.hosts_replicas(req.broker_id)

    epoch = txn.next_offset
    txn.broker_record(
        RegisterBrokerRecord(
            broker_id=req.broker_id,
            incarnation_id=req.incarnation_id,
            broker_epoch=epoch,
            endpoint=req.endpoint,
            rack=req.rack,
            previous_epoch=req.previous_epoch,
            clean=clean,
            fenced=True,
        )
    )
    response = RegisterBrokerResponse(broker_epoch=epoch, clean=clean)
    if not clean:
        return _broker_op(
            txn,
            BrokerOp.UNCLEAN_REGISTRATION,
            req.broker_id,
            response,
            config=config,
            budget=budget,
        )
    return HandlerResult(txn.records, response)


def unfence_broker(
    image: ClusterImage,
    req: UnfenceBroker,
    now_ms: int,
    config: ControllerConfig,
    budget: int | None = None,
) -> HandlerResult:
    """Rule 4: unfence, then elect wherever the broker's ELR membership makes it possible
    (classic rules: its ISR membership, as the last ISR member stays in the ISR)."""
    validation.check_broker_epoch(req)
    _require_broker(image, req.broker_id, req.broker_epoch)
    b = image.brokers[req.broker_id]
    if not b.fenced:
        return HandlerResult([], Ack())
    txn = _Txn(image)
    txn.broker_record(UnfenceBrokerRecord(broker_id=b.broker_id, broker_epoch=b.epoch))
    return _broker_op(txn, BrokerOp.UNFENCE, b.broker_id, Ack(), config=config, budget=budget)


def controlled_shutdown(
    image: ClusterImage,
    req: ControlledShutdown,
    now_ms: int,
    config: ControllerConfig,
    budget: int | None = None,
) -> HandlerResult:
    """Rule 5: no longer eligible; leadership moves away and the ISRs shrink (rule 1 may
    keep the cleanly stopping replica in the ELR). The answer says whether the broker
    still leads anything once the changes apply."""
    validation.check_broker_epoch(req)
    _require_broker(image, req.broker_id, req.broker_epoch)
    b = image.brokers[req.broker_id]
    if b.in_controlled_shutdown:
        # Its shutdown's changes are committed (they are one transaction with the record
        # that set the flag), and they moved leadership off every partition it led; no
        # election ever picks an inactive broker (rules 2, 7, 8), so it leads nothing.
        return HandlerResult([], ControlledShutdownResponse(can_stop=True))
    txn = _Txn(image)
    txn.broker_record(
        BrokerRegistrationChangeRecord(
            broker_id=b.broker_id, broker_epoch=b.epoch, in_controlled_shutdown=True
        )
    )
    return _broker_op(
        txn,
        BrokerOp.CONTROLLED_SHUTDOWN,
        b.broker_id,
        ControlledShutdownResponse(can_stop=False),
        config=config,
        budget=budget,
    )


def heartbeat(
    image: ClusterImage,
    req: BrokerHeartbeatRequest,
    now_ms: int,
    config: ControllerConfig,
    budget: int | None = None,
) -> HandlerResult:
    """A live broker's heartbeat: rule 5 when it asks to stop, rule 4 once it has caught up.

    The broker is unfenced when it is fenced, does not ask to stay fenced, and has applied
    the log past its own registration record (its epoch), so it knows its partitions.
    """
    validation.check_heartbeat(req)
    b = image.broker(req.broker_id)
    if b is None:
        raise BrokerIdNotRegisteredError(f"broker {req.broker_id} is not registered")
    if b.epoch != req.broker_epoch:
        raise StaleBrokerEpochError(
            f"heartbeat from broker {req.broker_id} at epoch {req.broker_epoch}, "
            f"current epoch is {b.epoch}"
        )
    fenced, shutting_down = b.fenced, b.in_controlled_shutdown
    if req.want_shutdown:
        result = controlled_shutdown(
            image,
            ControlledShutdown(broker_id=b.broker_id, broker_epoch=b.epoch),
            now_ms,
            config,
            budget,
        )
        return _as_heartbeat(result, fenced=fenced, shutting_down=True)
    if b.fenced and not req.want_fence and req.metadata_offset > b.epoch:
        result = unfence_broker(
            image,
            UnfenceBroker(broker_id=b.broker_id, broker_epoch=b.epoch),
            now_ms,
            config,
            budget,
        )
        return _as_heartbeat(result, fenced=False, shutting_down=shutting_down)
    return HandlerResult(
        [],
        BrokerHeartbeatResponse(
            is_fenced=fenced, in_controlled_shutdown=shutting_down, should_shut_down=False
        ),
    )


def _as_heartbeat(result: HandlerResult, *, fenced: bool, shutting_down: bool) -> HandlerResult:
    """A controlled shutdown or unfence, answered as the heartbeat that asked for it (its
    continuation, if sliced, answers the same way at the end)."""
    r = result.response
    stop = isinstance(r, ControlledShutdownResponse) and r.can_stop
    answer = BrokerHeartbeatResponse(
        is_fenced=fenced, in_controlled_shutdown=shutting_down, should_shut_down=stop
    )
    follow_up = result.follow_up
    if isinstance(follow_up, Continue):
        return HandlerResult(
            result.records, Ack(), msgspec.structs.replace(follow_up, response=answer)
        )
    return HandlerResult(result.records, answer)


def alter_partition(
    image: ClusterImage, req: AlterPartition, now_ms: int, config: ControllerConfig
) -> HandlerResult:
    """Rule 6, validated in the documented order, then rule 1."""
    validation.check_alter_partition(req)
    p = _require_partition(image, req.topic, req.partition)
    _require_broker(image, req.leader, req.broker_epoch)
    if p.leader != req.leader:
        raise NotLeaderOrFollowerError(
            f"broker {req.leader} is not the leader of {req.topic}-{req.partition} "
            f"(leader is {p.leader})"
        )
    if req.leader_epoch is not None and req.leader_epoch != p.leader_epoch:
        raise FencedLeaderEpochError(
            f"leader epoch {req.leader_epoch} is not the current {p.leader_epoch}"
        )
    if req.partition_epoch != p.partition_epoch:
        raise InvalidUpdateVersionError(
            f"partition epoch {req.partition_epoch} is not the current {p.partition_epoch} "
            f"of {req.topic}-{req.partition}"
        )
    target: set[int] = set()
    for m in req.isr:
        b = image.broker(m.broker_id)
        if m.broker_id not in p.replicas or b is None or not b.active:
            raise IneligibleReplicaError(
                f"replica {m.broker_id} of {req.topic}-{req.partition} is not an active replica"
            )
        if b.epoch != m.broker_epoch:
            raise IneligibleReplicaError(
                f"replica {m.broker_id} presented broker epoch {m.broker_epoch}, "
                f"the current epoch is {b.epoch}"
            )
        target.add(m.broker_id)
    if req.leader not in target:
        raise InvalidRequestError("the leader must stay in the ISR it proposes")
    if len(target) > 1 and not req.recovered and p.recovery_state.value:
        raise InvalidRequestError("cannot expand the ISR while the leader is still recovering")
    change = build_change(
        image,
        p,
        reason=ChangeReason.ALTER_PARTITION,
        target_isr=frozenset(target),
        recovered=req.recovered,
        broker=req.leader,
        elr_enabled=image.elr_enabled(config.eligible_leader_replicas),
    )
    if change is None:
        return HandlerResult([], partition_view(p))
    if p.reassigning:
        # KIP-455: once every target replica is in the ISR the reassignment completes,
        # in a second record that sees the first applied.
        after = replay(image, [change])
        done = complete_reassignment(
            after,
            after.partitions[p.tp],
            configured_min_isr=after.topic_min_isr(p.topic, config.default_min_insync_replicas),
            elr_enabled=after.elr_enabled(config.eligible_leader_replicas),
        )
        if done is not None:
            return HandlerResult([change, done], partition_view(after.partitions[p.tp], done))
    return HandlerResult([change], partition_view(p, change))


def alter_partitions(
    image: ClusterImage,
    req: AlterPartitions,
    now_ms: int,
    config: ControllerConfig,
    budget: int | None = None,
) -> HandlerResult:
    """Rule 6 for each item of a batched AlterPartition, each decided against `image` and
    answered alone: a refused item (its named error) does not refuse the others, as in
    Kafka's per-partition error codes. An item naming a partition an earlier item named is
    INVALID_REQUEST: both were proposed against one partition epoch, so at most one could
    be right. The service cuts a request into pieces of at most `budget` items; a longer
    piece is INVALID_REQUEST as a whole rather than a step over its budget."""
    if budget is not None and len(req.items) > budget:
        raise InvalidRequestError(
            f"{len(req.items)} AlterPartition items in one event, over the work budget {budget}"
        )
    records: list[MetadataRecord] = []
    results: list[AlterPartitionResult] = []
    seen: set[tuple[str, int]] = set()
    for item in req.items:
        key = (item.topic, item.partition)
        try:
            if key in seen:
                raise InvalidRequestError(
                    f"{item.topic}-{item.partition} is named twice in one AlterPartition"
                )
            seen.add(key)
            one = alter_partition(image, item, now_ms, config)
        except MetactlError as exc:
            results.append(
                AlterPartitionResult(
                    topic=item.topic, partition=item.partition, error_code=exc.code,
                    message=exc.message,
                )
            )  # fmt: skip
            continue
        assert isinstance(one.response, PartitionView)
        records.extend(one.records)
        results.append(
            AlterPartitionResult(topic=item.topic, partition=item.partition, view=one.response)
        )
    return HandlerResult(records, AlterPartitionsResponse(results=results))


def partition_view(p: PartitionState, change: PartitionChangeRecord | None = None) -> PartitionView:
    """The partition as the response shows it: `p`, or `p` once `change` applies (read off
    the record, as Kafka's handlers do, rather than by replaying it)."""
    if change is None:
        return PartitionView(
            topic=p.topic,
            partition=p.partition,
            leader=p.leader,
            leader_epoch=p.leader_epoch,
            partition_epoch=p.partition_epoch,
            isr=sorted(p.isr),
        )
    return PartitionView(
        topic=p.topic,
        partition=p.partition,
        leader=p.leader if change.leader is None else change.leader,
        leader_epoch=change.leader_epoch,
        partition_epoch=change.partition_epoch,
        isr=sorted(p.isr) if change.isr is None else list(change.isr),
    )


def elect_preferred(
    image: ClusterImage, req: ElectLeader, now_ms: int, config: ControllerConfig
) -> HandlerResult:
    """Rule 8: move leadership to the first assigned replica if it is an active ISR member."""
    validation.check_elect_leader(req)
    p = _require_partition(image, req.topic, req.partition)
    change = preferred_change(image, p)
    return HandlerResult([change], partition_view(p, change))


def preferred_change(image: ClusterImage, p: PartitionState) -> PartitionChangeRecord:
    """Rule 8 for one partition: leadership to its first replica, or why not (raised):
    ELECTION_NOT_NEEDED, or PREFERRED_LEADER_NOT_AVAILABLE when that replica is not an
    active ISR member. One election and bulk elections alike."""
    preferred = p.replicas[0]
    if p.leader == preferred:
        raise ElectionNotNeededError(f"{p.topic}-{p.partition} is led by its preferred replica")
    if preferred not in p.isr or not image.is_active(preferred):
        raise PreferredLeaderNotAvailableError(
            f"preferred replica {preferred} of {p.topic}-{p.partition} is not an active ISR member"
        )
    change = build_change(
        image, p, reason=ChangeReason.ELECTION, elect=(preferred, ElectionKind.PREFERRED)
    )
    assert change is not None  # the leader changes
    return change


def _striped(order: tuple[int, ...], start: int, end: int, rf: int) -> list[list[int]]:
    """Partitions [start, end) of the striped round-robin placement over `order`.

    The placement repeats every `len(order)` partitions, so each of its rotations is made
    once and shared by the partitions it places: treat the lists as read-only."""
    n = len(order)
    rotations = [[order[(p + j) % n] for j in range(rf)] for p in range(n)]
    first = start % n
    period = rotations[first:] + rotations[:first]  # from partition `start` on
    return (period * ((end - start) // n + 1))[: end - start]  # repeated in C


def _broker_order(image: ClusterImage) -> tuple[int, ...]:
    """The active brokers in placement order: with racks, the list alternates racks so
    that consecutive replicas land in different racks where possible."""
    active = sorted(b.broker_id for b in image.brokers.values() if b.active)
    racks: dict[str, list[int]] = {}
    for bid in active:
        racks.setdefault(image.brokers[bid].rack or "", []).append(bid)
    if len(racks) > 1:
        ordered: list[int] = []
        columns = [racks[r] for r in sorted(racks)]
        for i in range(max(len(c) for c in columns)):
            ordered.extend(c[i] for c in columns if i < len(c))
        active = ordered
    return tuple(active)


def check_explicit(image: ClusterImage, assignments: list[list[int]], first: int = 0) -> None:
    """Explicit assignments of partitions `first` on: valid broker ids, each list
    non-empty and distinct, every broker registered, at least one active per partition."""
    validation.check_assignment_ids(assignments)
    for i, a in enumerate(assignments, first):
        if not a or len(set(a)) != len(a):
            raise InvalidReplicaAssignmentError(
                f"partition {i}: replicas must be non-empty and distinct, got {a}"
            )
        unknown = [r for r in a if r not in image.brokers]
        if unknown:
            raise InvalidReplicaAssignmentError(f"partition {i}: unknown broker(s) {unknown}")
        if not any(image.is_active(r) for r in a):
            raise InvalidReplicaAssignmentError(f"partition {i}: no active replica in {a}")


def create_topic(
    image: ClusterImage,
    req: CreateTopic,
    now_ms: int,
    config: ControllerConfig,
    known_strategies: frozenset[str] = frozenset(),
    *,
    slice_partitions: int | None = None,
) -> HandlerResult:
    """Rule 9.

    With `slice_partitions`, a topic of more partitions is created in slices of that many
    (the step wraps them in one transaction): this call validates the whole request and
    writes the TopicRecord and the first slice, and its result's `follow_up` is the rest
    (`create_topic_slice`). Striped placement is then computed slice by slice.
    """
    validation.check_topic_name(req.name)
    if req.name in image.topics:
        raise TopicAlreadyExistsError(f"topic {req.name} already exists")
    if req.recovery_strategy is not None and req.recovery_strategy not in known_strategies:
        raise UnknownRecoveryPolicyError(
            f"unknown unclean recovery strategy {req.recovery_strategy!r}; "
            f"known: {', '.join(sorted(known_strategies))}"
        )
    min_isr = (
        req.min_isr
        if req.min_isr is not None
        else image.cluster_min_isr(config.default_min_insync_replicas)
    )
    validation.check_min_isr(min_isr)
    order: tuple[int, ...] = ()
    rf = 0
    explicit: list[list[int]] | None = None
    if req.assignments is not None:
        assignments = explicit = [list(a) for a in req.assignments]
        partitions = len(assignments)
        if not assignments:
            raise InvalidReplicaAssignmentError("an explicit assignment needs a partition")
        if req.partitions is not None and req.partitions != len(assignments):
            raise InvalidRequestError("partitions does not match the explicit assignment")
        check_explicit(image, assignments)
    else:
        partitions = req.partitions if req.partitions is not None else config.default_partitions
        validation.check_partition_count(partitions)
        rf = (
            req.replication_factor
            if req.replication_factor is not None
            else config.default_replication_factor
        )
        validation.check_replication_factor(rf, sum(1 for b in image.brokers.values() if b.active))
        order = _broker_order(image)
        # The first slice: every striped assignment has the same length (for the checks).
        assignments = _striped(order, 0, min(partitions, slice_partitions or partitions), rf)
    # A min.insync.replicas above the replication factor is accepted, as in Kafka: each
    # partition's effective MinISR is capped at its replication factor.
    if req.topic_id is not None:
        validation.check_topic_id(req.topic_id)
        topic_id = req.topic_id
        if topic_id in image.topic_ids:
            raise TopicAlreadyExistsError(f"topic id {topic_id} is taken; retry the create")
    else:
        # A caller without randomness (a seeded simulation): derived from the name and
        # offset, so unique within this log. The controller's driver always draws one.
        topic_id = str(uuid.uuid5(_TOPIC_ID_NAMESPACE, f"{req.name}@{image.end_offset}"))
    plan = CreateTopicSlice(
        name=req.name,
        topic_id=topic_id,
        partitions=partitions,
        min_isr=min_isr,
        start=0,
        assignments=explicit,
        brokers=order,
        replication_factor=rf,
    )
    topic = TopicRecord(
        name=req.name,
        topic_id=topic_id,
        partitions=plan.partitions,
        min_isr=req.min_isr,
        recovery_strategy=req.recovery_strategy,
    )
    first = create_topic_slice(image, plan, slice_partitions, placed=assignments)
    return HandlerResult([topic, *first.records], first.response, first.follow_up)


def create_topic_slice(
    image: ClusterImage,
    s: CreateTopicSlice,
    slice_partitions: int | None = None,
    *,
    placed: list[list[int]] | None = None,
) -> HandlerResult:
    """The PartitionRecords of partitions [s.start, s.start + slice_partitions) of a topic
    `create_topic` validated, and the next slice, if any partitions remain; the last slice
    answers with the whole topic's placement. `placed` is this slice's striped placement
    when the caller already computed it."""
    end = s.partitions
    if slice_partitions is not None:
        end = min(end, s.start + slice_partitions)
    if s.assignments is not None:
        part = s.assignments[s.start - s.first : end - s.first]
    elif placed is not None:
        part = placed
    else:
        part = _striped(s.brokers, s.start, end, s.replication_factor)
    records: list[MetadataRecord] = []
    append = records.append
    replace = msgspec.structs.replace
    live = image.active
    # Placement repeats a few assignments (striped placement shares one list per
    # rotation): each one's record is made once and restamped with the partition number.
    shapes: dict[object, PartitionRecord] = {}
    for i, a in enumerate(part, s.start):
        key = id(a) if s.assignments is None else tuple(a)
        proto = shapes.get(key)
        if proto is None:
            isr = [r for r in a if r in live]
            proto = shapes[key] = PartitionRecord(
                topic=s.name,
                partition=i,
                replicas=a,
                isr=sorted(isr),
                leader=isr[0],
                min_isr=min(s.min_isr, len(a)),
            )
            append(proto)
        else:
            append(replace(proto, partition=i))
    done = s.placed if s.assignments is not None else (*s.placed, part)
    if end < s.partitions:
        rest = msgspec.structs.replace(s, start=end, placed=done)
        return HandlerResult(records, Ack(), rest)
    assignments = (
        s.assignments if s.assignments is not None else [a for chunk in done for a in chunk]
    )
    return HandlerResult(
        records, CreateTopicResponse(name=s.name, topic_id=s.topic_id, assignments=assignments)
    )
