"""Pure handlers of the metadata lifecycle: configs, features, delete, add partitions,
reassignment and unregister, each with KIP-966's rules (`docs/lifecycle.md`).

Like the broker, partition and topic handlers (`controller.core.broker_handlers`,
`partition_handlers`, `topic_handlers`), every handler is `(image, request, ...) ->
HandlerResult`: it validates (a refusal raises a coded `MetactlError` before any record
exists) and returns records and the response; `replay` applies them. Work larger than
the budget (`controller.core.work`) comes back as a continuation the step runs inside one
transaction: clearing ELRs over many partitions (`ClearElrSlice`) and reassigning many
partitions (`ReassignSlice`); unregistering a broker reuses the broker slicing of
`broker_handlers` (`Continue`).

Must not: read a clock, draw randomness (a topic id comes in on the event), do IO, or
change an image.
"""

from __future__ import annotations

from typing import Final

import msgspec

from controller.core import validation
from controller.core.broker_handlers import Txn, broker_op
from controller.core.config import ControllerConfig
from controller.core.handler_result import (
    BrokerOp,
    ClearElrSlice,
    CreateTopicSlice,
    HandlerResult,
    ReassignSlice,
)
from controller.core.partition_change import move_replicas
from controller.core.partition_handlers import preferred_change
from controller.core.topic_handlers import broker_order, check_explicit, create_topic_slice
from metactl.errors import (
    BrokerIdNotRegisteredError,
    ElectionNotNeededError,
    InvalidConfigurationError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidRequestError,
    MetactlError,
    NoReassignmentInProgressError,
    PreferredLeaderNotAvailableError,
    UnknownTopicOrPartitionError,
)
from metactl.numbers import parse_int
from metadata_image.image import ClusterImage
from metadata_log.records import (
    BROKER_RESOURCE,
    CLEAR_ELR_EPOCH_VERSION,
    ELR_FEATURE,
    MIN_ISR_CONFIG,
    TOPIC_RESOURCE,
    ClearElrRecord,
    ConfigRecord,
    FeatureLevelRecord,
    MetadataRecord,
    PartitionChangeRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnregisterBrokerRecord,
)
from protocol.messages.admin import (
    AlterConfigs,
    AlterConfigsResponse,
    AlterPartitionReassignments,
    AlterPartitionReassignmentsResponse,
    CreatePartitions,
    DeleteTopic,
    DeleteTopicResponse,
    ElectionFailure,
    ElectPreferredLeadersResponse,
    Reassignment,
    ReassignmentResult,
    UnregisterBroker,
    UpdateFeature,
    UpdateFeatureResponse,
)
from protocol.messages.internal import Ack
from protocol.messages.unions import ControllerResponse

SUPPORTED_FEATURES: Final = {ELR_FEATURE: (0, 1)}
"""Feature -> (lowest, highest) level this controller supports (kafka-features)."""


class Bootstrap(msgspec.Struct, frozen=True, gc=False):
    """Pin what the controller's static settings seed on a new cluster: the
    eligible.leader.replicas.version level and the cluster-default min.insync.replicas
    (Kafka writes both in its bootstrap records). Only the controller submits it, to
    itself, when it becomes active over a log that holds neither."""


# --- configs and features -------------------------------------------------------------


def needs_bootstrap(image: ClusterImage) -> bool:
    return ELR_FEATURE not in image.features or MIN_ISR_CONFIG not in image.cluster_configs


def bootstrap(image: ClusterImage, config: ControllerConfig) -> HandlerResult:
    records: list[MetadataRecord] = []
    if ELR_FEATURE not in image.features:
        records.append(
            FeatureLevelRecord(name=ELR_FEATURE, level=1 if config.eligible_leader_replicas else 0)
        )
    if MIN_ISR_CONFIG not in image.cluster_configs:
        records.append(
            ConfigRecord(
                resource_type=BROKER_RESOURCE,
                resource_name="",
                name=MIN_ISR_CONFIG,
                value=str(config.default_min_insync_replicas),
            )
        )
    return HandlerResult(records, Ack())


def _min_isr_value(text: str) -> int:
    """The config's value as Kafka parses an INT config: an optional sign and the digits
    0-9, trimmed, within Java's int (`metactl.numbers`); INVALID_CONFIG otherwise."""
    value = parse_int(text, MIN_ISR_CONFIG)
    validation.check_min_isr(value)
    return value


def alter_configs(
    image: ClusterImage, req: AlterConfigs, config: ControllerConfig, budget: int | None
) -> HandlerResult:
    """kafka-configs --alter: set or delete min.insync.replicas of a topic or of the
    cluster default, and clear the ELRs it governs (KIP-966): a topic update clears that
    topic's, a cluster-default update, even to the same value, every topic's."""
    validation.check_alter_configs(req)
    keys = set(req.set_configs) | set(req.delete_configs)
    if set(req.set_configs) & set(req.delete_configs):
        raise InvalidRequestError("a config cannot be both set and deleted in one request")
    unknown = sorted(k for k in keys if k != MIN_ISR_CONFIG)
    if unknown:
        raise InvalidConfigurationError(
            f"unsupported config(s) {', '.join(unknown)}: metactl keeps only {MIN_ISR_CONFIG}"
        )
    if not keys:
        raise InvalidRequestError("nothing to alter: give a config to set or delete")
    value: str | None = None
    if MIN_ISR_CONFIG in req.set_configs:
        value = str(_min_isr_value(req.set_configs[MIN_ISR_CONFIG]))
    record = ConfigRecord(
        resource_type=req.resource_type,
        resource_name=req.resource_name,
        name=MIN_ISR_CONFIG,
        value=value,
    )
    default = config.default_min_insync_replicas
    if req.resource_type == TOPIC_RESOURCE:
        t = image.topics.get(req.resource_name)
        if t is None:
            raise UnknownTopicOrPartitionError(f"unknown topic {req.resource_name}")
        if t.min_isr == (None if value is None else int(value)):
            # Kafka writes a ConfigRecord only when the value changes, and the ELR clear
            # follows from the records written: setting the current value, or deleting a
            # value never set, writes nothing and keeps the ELR (it may hold the one
            # replica that has all the data). The cluster default is the exception.
            return HandlerResult(
                [],
                AlterConfigsResponse(
                    resource_type=req.resource_type,
                    resource_name=req.resource_name,
                    cleared_topics=0,
                ),
            )
        cluster = image.cluster_min_isr(default)
        topics: tuple[tuple[str, int, int | None], ...] = (
            (t.name, t.partitions, int(value) if value is not None else cluster),
        )
    else:
        if req.resource_name != "":
            # Kafka refuses it with INVALID_CONFIG while the ELR is on; metactl keeps no
            # broker-level configs at either level (a difference, docs/lifecycle.md).
            why = (
                "is not allowed while eligible leader replicas are on"
                if image.elr_enabled(config.eligible_leader_replicas)
                else "is not kept by metactl (it keeps topic values and the cluster default)"
            )
            raise InvalidConfigurationError(
                f"broker-level {MIN_ISR_CONFIG} {why}: set the cluster default "
                "(--entity-type brokers --entity-default)"
            )
        if value is None:
            raise InvalidConfigurationError(
                f"the cluster-level {MIN_ISR_CONFIG} cannot be deleted; set a new value instead"
            )
        new_default = int(value)
        topics = tuple(
            (t.name, t.partitions, t.min_isr if t.min_isr is not None else new_default)
            for t in sorted(image.topics.values(), key=lambda t: t.name)
        )
    response = AlterConfigsResponse(
        resource_type=req.resource_type,
        resource_name=req.resource_name,
        cleared_topics=len(topics),
    )
    return _clearing([record], topics, response, budget)


def update_feature(
    image: ClusterImage, req: UpdateFeature, config: ControllerConfig, budget: int | None
) -> HandlerResult:
    """kafka-features upgrade|downgrade of eligible.leader.replicas.version. A downgrade
    to 0 stops ELR tracking and clears every ELR and LastKnownELR; an upgrade to 1 starts
    tracking from the current ISRs (nothing else changes until the next ISR change)."""
    validation.check_update_feature(req)
    supported = SUPPORTED_FEATURES.get(req.name)
    if supported is None:
        raise InvalidRequestError(
            f"unknown feature {req.name!r}; supported: {', '.join(sorted(SUPPORTED_FEATURES))}"
        )
    low, high = supported
    if not low <= req.level <= high:
        raise InvalidRequestError(f"{req.name} supports levels {low}..{high}, not {req.level}")
    current = 1 if image.elr_enabled(config.eligible_leader_replicas) else 0
    if req.upgrade_type == "upgrade" and req.level < current:
        raise InvalidRequestError(
            f"{req.name} is at {current}: lowering it to {req.level} is a downgrade"
        )
    if req.upgrade_type == "downgrade" and req.level > current:
        raise InvalidRequestError(
            f"{req.name} is at {current}: raising it to {req.level} is an upgrade"
        )
    if req.level >= 1 and config.unclean_leader_election:
        raise InvalidRequestError(
            "the controller runs with --unclean-leader-election, a classic-mode setting: "
            "restart it without that flag before enabling eligible leader replicas"
        )
    finalized = image.features.get(req.name)
    if finalized == req.level:
        return HandlerResult([], UpdateFeatureResponse(name=req.name, level=req.level))
    record = FeatureLevelRecord(name=req.name, level=req.level)
    if req.level >= 1 or current == 0:
        return HandlerResult([record], UpdateFeatureResponse(name=req.name, level=req.level))
    topics = tuple(
        (t.name, t.partitions, None) for t in sorted(image.topics.values(), key=lambda t: t.name)
    )
    response = UpdateFeatureResponse(name=req.name, level=req.level, cleared_topics=len(topics))
    return _clearing([record], topics, response, budget)


def _clearing(
    records: list[MetadataRecord],
    topics: tuple[tuple[str, int, int | None], ...],
    response: ControllerResponse,
    budget: int | None,
) -> HandlerResult:
    first = clear_elr_slice(ClearElrSlice(topics, 0, response), budget)
    return HandlerResult(records + first.records, first.response, first.follow_up)


def clear_elr_slice(s: ClearElrSlice, budget: int | None) -> HandlerResult:
    """ClearElrRecords for the next `budget` partitions of `s` (one record per topic
    range), and the rest, if any."""
    left = budget if budget is not None else 1 << 62
    records: list[MetadataRecord] = []
    topics, start = s.topics, s.start
    i = 0
    while i < len(topics) and left > 0:
        name, partitions, min_isr = topics[i]
        end = min(partitions, start + left)
        records.append(
            ClearElrRecord(
                v=CLEAR_ELR_EPOCH_VERSION,
                topic=name,
                min_isr=min_isr,
                first=start,
                end=None if start == 0 and end == partitions else end,
            )
        )
        left -= max(1, end - start)  # an empty topic still costs a record
        if end >= partitions:
            i, start = i + 1, 0
        else:
            start = end
    if i >= len(topics):
        return HandlerResult(records, s.response)
    return HandlerResult(records, Ack(), ClearElrSlice(topics[i:], start, s.response))


# --- topics ---------------------------------------------------------------------------


def delete_topic(image: ClusterImage, req: DeleteTopic) -> HandlerResult:
    """kafka-topics --delete: one RemoveTopicRecord. Replay drops the topic, its
    partitions and their indexes; brokers stop serving it and delete its data."""
    validation.check_topic_name(req.name)
    t = image.topics.get(req.name)
    if t is None:
        raise UnknownTopicOrPartitionError(f"unknown topic {req.name}")
    return HandlerResult(
        [RemoveTopicRecord(topic_id=t.topic_id, name=t.name)],
        DeleteTopicResponse(name=t.name, topic_id=t.topic_id),
    )


def create_partitions(
    image: ClusterImage, req: CreatePartitions, config: ControllerConfig, budget: int | None
) -> HandlerResult:
    """kafka-topics --alter --partitions N: grow the topic, placing the new partitions
    as at create (striped over the active brokers, racks alternating), with the topic's
    replication factor (its first partition's target). A decrease or no change is
    INVALID_PARTITIONS."""
    validation.check_topic_name(req.topic)
    validation.check_partition_count(req.count)
    t = image.topics.get(req.topic)
    if t is None:
        raise UnknownTopicOrPartitionError(f"unknown topic {req.topic}")
    if req.count <= t.partitions:
        raise InvalidPartitionsError(
            f"topic {t.name} has {t.partitions} partitions; the new count {req.count} must be "
            "larger (partitions cannot be removed)"
        )
    new = req.count - t.partitions
    first = image.partitions.get((t.name, 0))
    rf = len(first.target) if first is not None else config.default_replication_factor
    min_isr = image.topic_min_isr(t.name, config.default_min_insync_replicas)
    explicit: list[list[int]] | None = None
    order: tuple[int, ...] = ()
    if req.assignments is not None:
        explicit = [list(a) for a in req.assignments]
        if len(explicit) != new:
            raise InvalidReplicaAssignmentError(
                f"{len(explicit)} assignments given for {new} new partitions"
            )
        check_explicit(image, explicit, t.partitions)
        assignments: list[list[int]] | None = explicit
    else:
        validation.check_replication_factor(rf, len(image.active))
        order = broker_order(image)
        assignments = None
    plan = CreateTopicSlice(
        name=t.name,
        topic_id=t.topic_id,
        partitions=req.count,
        min_isr=min_isr,
        start=t.partitions,
        assignments=assignments,
        brokers=order,
        replication_factor=rf,
        first=t.partitions,
    )
    grown = TopicRecord(
        name=t.name,
        topic_id=t.topic_id,
        partitions=req.count,
        min_isr=t.min_isr,
        recovery_strategy=t.recovery_strategy,
    )
    first = create_topic_slice(image, plan, budget)
    return HandlerResult([grown, *first.records], first.response, first.follow_up)


# --- reassignment (KIP-455) -------------------------------------------------------------


def alter_reassignments(
    image: ClusterImage,
    req: AlterPartitionReassignments,
    config: ControllerConfig,
    budget: int | None,
) -> HandlerResult:
    """kafka-reassign-partitions --execute / --cancel: each partition succeeds or fails
    alone. The first `budget` partitions are decided now, the rest as `ReassignSlice`s."""
    validation.check_reassignments(req)
    s = ReassignSlice(tuple(req.reassignments), 0, ())
    return reassign_slice(image, s, config, budget)


def reassign_slice(
    image: ClusterImage, s: ReassignSlice, config: ControllerConfig, budget: int | None
) -> HandlerResult:
    end = len(s.reassignments) if budget is None else min(len(s.reassignments), s.position + budget)
    records: list[MetadataRecord] = []
    results = list(s.results)
    for r in s.reassignments[s.position : end]:
        try:
            records.extend(reassign(image, r, config))
        except MetactlError as exc:
            results.append(
                ReassignmentResult(
                    topic=r.topic, partition=r.partition, error_code=exc.code, message=exc.message
                )
            )
        else:
            results.append(ReassignmentResult(topic=r.topic, partition=r.partition))
    if end < len(s.reassignments):
        return HandlerResult(records, Ack(), ReassignSlice(s.reassignments, end, tuple(results)))
    return HandlerResult(records, AlterPartitionReassignmentsResponse(results=results))


def reassign(
    image: ClusterImage, r: Reassignment, config: ControllerConfig
) -> list[PartitionChangeRecord]:
    """One partition's reassignment (or, with `replicas` None, its cancel)."""
    p = image.partition((r.topic, r.partition))
    if p is None:
        raise UnknownTopicOrPartitionError(f"unknown partition {r.topic}-{r.partition}")
    original = p.original
    if r.replicas is None:
        if not p.reassigning:
            raise NoReassignmentInProgressError(
                f"no reassignment of {r.topic}-{r.partition} is in progress"
            )
        target: tuple[int, ...] = original
    else:
        target = tuple(r.replicas)
        if not target or len(set(target)) != len(target):
            raise InvalidReplicaAssignmentError(
                f"{r.topic}-{r.partition}: replicas must be non-empty and distinct, "
                f"got {list(target)}"
            )
        unknown = [b for b in target if b not in image.brokers]
        if unknown:
            raise InvalidReplicaAssignmentError(
                f"{r.topic}-{r.partition}: broker(s) {unknown} are not registered"
            )
        if target == p.replicas and not p.reassigning:
            return []  # already so: nothing to do
    adding = tuple(b for b in target if b not in original)
    removing = tuple(b for b in original if b not in target)
    full = target + removing
    elr_on = image.elr_enabled(config.eligible_leader_replicas)
    # A move (or cancel) may not take every replica that may hold the acknowledged
    # records out of the assignment: every ISR member, or with the ISR empty every ELR
    # member, or with both empty every LastKnownELR member (the recovery candidates).
    # Say replicas being added caught up and are the only ones in sync: a cancel would
    # drop them. Refused in both modes; bring a replica of the new assignment in sync
    # first, or elect (an unclean election is an operator's explicit choice). Kafka
    # refuses an unclean revert too (docs/lifecycle.md).
    leaving = frozenset(p.replicas) - frozenset(full)
    holders, which = next(
        ((s, name) for s, name in ((p.isr, "ISR"), (p.elr, "ELR")) if s),
        (p.last_known_elr, "LastKnownELR"),
    )
    if holders and not frozenset(target) <= p.isr and holders <= leaving:
        raise InvalidReplicaAssignmentError(
            f"{r.topic}-{r.partition}: every {which} member ({sorted(holders)}) would leave "
            "the assignment, and with it the only replicas known to hold every "
            "acknowledged record"
        )
    change = move_replicas(
        image,
        p,
        full,
        adding,
        removing,
        configured_min_isr=image.topic_min_isr(p.topic, config.default_min_insync_replicas),
        elr_enabled=elr_on,
    )
    return [] if change is None else [change]


# --- preferred elections in bulk -------------------------------------------------------

MAX_ELECTION_FAILURES: Final = 100
"""How many failed partitions an ElectPreferredLeaders answer names (the counts are whole)."""


class ElectPreferredGroup(msgspec.Struct, frozen=True, gc=False):
    """One piece of a bulk preferred election: at most a work budget of partitions, as
    (topic, partition numbers) runs. The service cuts an ElectPreferredLeaders into these
    and submits them one by one, each its own event and commit (Kafka balances leaders a
    bounded piece at a time, not atomically), summing the answers."""

    groups: tuple[tuple[str, tuple[int, ...]], ...]


def elect_preferred_group(
    image: ClusterImage, req: ElectPreferredGroup, config: ControllerConfig
) -> HandlerResult:
    """Rule 8 for each partition of the piece: leadership moves to the first replica
    where it is an active ISR member; the others are counted (and the first failures
    named)."""
    elected = not_needed = not_available = unknown = 0
    failures: list[ElectionFailure] = []
    records: list[MetadataRecord] = []
    parts = image.partitions
    for topic, numbers in req.groups:
        for i in numbers:
            p = parts.get((topic, i))
            code = None
            if p is None:
                unknown += 1
                code = UnknownTopicOrPartitionError.code
            else:
                try:
                    records.append(preferred_change(image, p))
                    elected += 1
                except ElectionNotNeededError:
                    not_needed += 1
                except PreferredLeaderNotAvailableError as exc:
                    not_available += 1
                    code = exc.code
            if code is not None and len(failures) < MAX_ELECTION_FAILURES:
                failures.append(ElectionFailure(topic=topic, partition=i, error_code=code))
    return HandlerResult(
        records,
        ElectPreferredLeadersResponse(
            elected=elected,
            not_needed=not_needed,
            not_available=not_available,
            unknown=unknown,
            failures=failures,
        ),
    )


def add_up(
    total: ElectPreferredLeadersResponse, piece: ElectPreferredLeadersResponse
) -> ElectPreferredLeadersResponse:
    """Two answers of a bulk preferred election as one."""
    return ElectPreferredLeadersResponse(
        elected=total.elected + piece.elected,
        not_needed=total.not_needed + piece.not_needed,
        not_available=total.not_available + piece.not_available,
        unknown=total.unknown + piece.unknown,
        failures=(total.failures + piece.failures)[:MAX_ELECTION_FAILURES],
    )


# --- brokers ----------------------------------------------------------------------------


def unregister_broker(
    image: ClusterImage, req: UnregisterBroker, config: ControllerConfig, budget: int | None
) -> HandlerResult:
    """kafka-cluster unregister: only a fenced broker (KIP-631; an active one is
    refused). Its registration goes, and it leaves every ISR, ELR and LastKnownELR
    (KIP-966: a broker that is gone cannot be a recovery candidate, and its id may come
    back on an empty disk). Its replicas stay assigned, as in Kafka."""
    validation.broker_id(req.broker_id)
    b = image.broker(req.broker_id)
    if b is None:
        raise BrokerIdNotRegisteredError(f"broker {req.broker_id} is not registered")
    if not b.fenced:
        raise InvalidRequestError(
            f"broker {req.broker_id} is active (unfenced, epoch {b.epoch}): stop it and wait "
            "for it to be fenced before unregistering it"
        )
    txn = Txn(image)
    txn.broker_record(UnregisterBrokerRecord(broker_id=b.broker_id, broker_epoch=b.epoch))
    return broker_op(txn, BrokerOp.UNREGISTER, b.broker_id, Ack(), config=config, budget=budget)
