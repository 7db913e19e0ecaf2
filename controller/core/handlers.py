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

import uuid
from collections.abc import Iterable
from typing import Final

import msgspec

from controller.core import validation
from controller.core.config import ControllerConfig
from controller.core.partition_change import build_change, remove_from_isrs
from metactl.errors import (
    BrokerIdNotRegisteredError,
    DuplicateBrokerRegistrationError,
    ElectionNotNeededError,
    FencedLeaderEpochError,
    IneligibleReplicaError,
    InvalidReplicaAssignmentError,
    InvalidRequestError,
    InvalidUpdateVersionError,
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
    RegisterBroker,
    RegisterBrokerResponse,
    UnfenceBroker,
)

# Topic ids are derived (name and offset), not random, so that handlers stay pure.
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
    assignments: list[list[int]] | None = None
    brokers: tuple[int, ...] = ()
    replication_factor: int = 0
    placed: tuple[list[list[int]], ...] = ()


class HandlerResult(msgspec.Struct, frozen=True):
    records: list[MetadataRecord]
    response: ControllerResponse
    # A topic created in slices: the slice to step next (the response is then a
    # placeholder; the last slice's response is the request's).
    follow_up: CreateTopicSlice | None = None


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
    broker led."""
    txn.partition_changes(
        remove_from_isrs(
            txn.image, broker_id, reason=reason, elr_enabled=config.eligible_leader_replicas
        )
    )


def fence_broker(
    image: ClusterImage, req: FenceBroker, now_ms: int, config: ControllerConfig
) -> HandlerResult:
    validation.check_fence_broker(req)
    _require_broker(image, req.broker_id)
    b = image.brokers[req.broker_id]
    if b.fenced:
        return HandlerResult([], Ack())
    txn = _Txn(image)
    txn.broker_record(
        FenceBrokerRecord(broker_id=b.broker_id, broker_epoch=b.epoch, reason=req.reason)
    )
    _fence_changes(txn, b.broker_id, ChangeReason.FENCE, config)
    return HandlerResult(txn.records, Ack())


def register_broker(
    image: ClusterImage, req: RegisterBroker, now_ms: int, config: ControllerConfig
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
    if not clean:
        excluded = frozenset((req.broker_id,))
        img = txn.image
        txn.partition_changes(
            build_change(
                img,
                p,
                reason=ChangeReason.UNCLEAN_REGISTRATION,
                unclean_excluded=excluded,
                broker=req.broker_id,
            )
            for p in img.partitions_of(req.broker_id)
            if req.broker_id in p.elr
        )
    return HandlerResult(txn.records, RegisterBrokerResponse(broker_epoch=epoch, clean=clean))


def unfence_broker(
    image: ClusterImage, req: UnfenceBroker, now_ms: int, config: ControllerConfig
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
    img = txn.image
    txn.partition_changes(
        build_change(
            img,
            p,
            reason=ChangeReason.UNFENCE,
            broker=b.broker_id,
            elr_enabled=config.eligible_leader_replicas,
        )
        for p in img.partitions_of(b.broker_id)
        if p.leader == NO_LEADER and (b.broker_id in p.elr or b.broker_id in p.isr)
    )
    return HandlerResult(txn.records, Ack())


def controlled_shutdown(
    image: ClusterImage, req: ControlledShutdown, now_ms: int, config: ControllerConfig
) -> HandlerResult:
    """Rule 5: no longer eligible; leadership moves away and the ISRs shrink (rule 1 may
    keep the cleanly stopping replica in the ELR)."""
    validation.check_broker_epoch(req)
    _require_broker(image, req.broker_id, req.broker_epoch)
    b = image.brokers[req.broker_id]
    txn = _Txn(image)
    if not b.in_controlled_shutdown:
        txn.broker_record(
            BrokerRegistrationChangeRecord(
                broker_id=b.broker_id, broker_epoch=b.epoch, in_controlled_shutdown=True
            )
        )
        _fence_changes(txn, b.broker_id, ChangeReason.CONTROLLED_SHUTDOWN, config)
    return HandlerResult(
        txn.records, ControlledShutdownResponse(can_stop=not _leads_after(txn, b.broker_id))
    )


def _leads_after(txn: _Txn, broker_id: int) -> bool:
    """Whether the broker still leads a partition once the request's changes apply."""
    moved = {(c.topic, c.partition) for c in txn.changes if c.leader is not None}
    return any(
        p.leader == broker_id and p.tp not in moved for p in txn.image.partitions_of(broker_id)
    )


def heartbeat(
    image: ClusterImage, req: BrokerHeartbeatRequest, now_ms: int, config: ControllerConfig
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
    fenced, shutting_down, should_stop = b.fenced, b.in_controlled_shutdown, False
    records: list[MetadataRecord] = []
    if req.want_shutdown:
        result = controlled_shutdown(
            image, ControlledShutdown(broker_id=b.broker_id, broker_epoch=b.epoch), now_ms, config
        )
        assert isinstance(result.response, ControlledShutdownResponse)
        records, shutting_down, should_stop = result.records, True, result.response.can_stop
    elif b.fenced and not req.want_fence and req.metadata_offset > b.epoch:
        result = unfence_broker(
            image, UnfenceBroker(broker_id=b.broker_id, broker_epoch=b.epoch), now_ms, config
        )
        records, fenced = result.records, False
    return HandlerResult(
        records,
        BrokerHeartbeatResponse(
            is_fenced=fenced, in_controlled_shutdown=shutting_down, should_shut_down=should_stop
        ),
    )


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
        elr_enabled=config.eligible_leader_replicas,
    )
    if change is None:
        return HandlerResult([], partition_view(p))
    return HandlerResult([change], partition_view(p, change))


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
    preferred = p.replicas[0]
    if p.leader == preferred:
        raise ElectionNotNeededError(f"{req.topic}-{req.partition} is led by its preferred replica")
    if preferred not in p.isr or not image.is_active(preferred):
        raise PreferredLeaderNotAvailableError(
            f"preferred replica {preferred} of {req.topic}-{req.partition} "
            "is not an active ISR member"
        )
    change = build_change(
        image, p, reason=ChangeReason.ELECTION, elect=(preferred, ElectionKind.PREFERRED)
    )
    assert change is not None  # the leader changes
    return HandlerResult([change], partition_view(p, change))


def _striped(order: tuple[int, ...], start: int, end: int, rf: int) -> list[list[int]]:
    """Partitions [start, end) of the striped round-robin placement over `order`."""
    n = len(order)
    return [[order[(p + j) % n] for j in range(rf)] for p in range(start, end)]


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
    min_isr = req.min_isr if req.min_isr is not None else config.default_min_insync_replicas
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
        validation.check_assignment_ids(assignments)
        for i, a in enumerate(assignments):
            if not a or len(set(a)) != len(a):
                raise InvalidReplicaAssignmentError(
                    f"partition {i}: replicas must be non-empty and distinct, got {a}"
                )
            unknown = [r for r in a if r not in image.brokers]
            if unknown:
                raise InvalidReplicaAssignmentError(f"partition {i}: unknown broker(s) {unknown}")
            if not any(image.is_active(r) for r in a):
                raise InvalidReplicaAssignmentError(f"partition {i}: no active replica in {a}")
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
    validation.check_min_isr_fits(req.min_isr, assignments)

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
        min_isr=min_isr,
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
        part = s.assignments[s.start : end]
    elif placed is not None:
        part = placed
    else:
        part = _striped(s.brokers, s.start, end, s.replication_factor)
    records: list[MetadataRecord] = []
    live = image.active
    # Striped placement repeats a few assignments; work out each one's ISR once.
    shapes: dict[tuple[int, ...], tuple[list[int], int, int]] = {}
    for i, a in enumerate(part, s.start):
        key = tuple(a)
        shape = shapes.get(key)
        if shape is None:
            isr = [r for r in a if r in live]
            shape = shapes[key] = (sorted(isr), isr[0], min(s.min_isr, len(a)))
        records.append(
            PartitionRecord(
                topic=s.name,
                partition=i,
                replicas=a,
                isr=shape[0],
                leader=shape[1],
                min_isr=shape[2],
            )
        )
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
