"""Pure handlers of a partition's leader and ISR: AlterPartition (one, or a broker's
batch, each item answered alone) and the preferred election, each `(image, request,
now_ms, config) -> HandlerResult`, and the partition as an answer shows it
(`partition_view`).

Every field is first checked against the range Kafka gives it
(`controller.core.validation`); a refusal raises a coded `MetactlError` before any record
exists. Rule 6 (AlterPartition, validated in the documented order, then rule 1 through
`partition_change`) and rule 8 (preferred election; a bulk one is
`controller.core.lifecycle`'s, a work budget at a time) live here; rule 7, unclean
recovery, lives in `controller.core.recovery`.

Must not: read a clock, do IO, or change an image.
"""

from __future__ import annotations

from controller.core import validation
from controller.core.broker_handlers import require_broker
from controller.core.config import ControllerConfig
from controller.core.handler_result import HandlerResult
from controller.core.partition_change import build_change, complete_reassignment
from metactl.errors import (
    ElectionNotNeededError,
    FencedLeaderEpochError,
    IneligibleReplicaError,
    InvalidRequestError,
    InvalidUpdateVersionError,
    MetactlError,
    NotLeaderOrFollowerError,
    PreferredLeaderNotAvailableError,
    UnknownTopicOrPartitionError,
)
from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from metadata_image.state import PartitionState
from metadata_log.records import (
    ChangeReason,
    ElectionKind,
    MetadataRecord,
    PartitionChangeRecord,
)
from protocol.messages.admin import ElectLeader
from protocol.messages.broker_controller import (
    AlterPartition,
    AlterPartitionResult,
    AlterPartitions,
    AlterPartitionsResponse,
    PartitionView,
)


def require_partition(image: ClusterImage, topic: str, partition: int) -> PartitionState:
    p = image.partition((topic, partition))
    if p is None:
        raise UnknownTopicOrPartitionError(f"unknown partition {topic}-{partition}")
    return p


def alter_partition(
    image: ClusterImage, req: AlterPartition, now_ms: int, config: ControllerConfig
) -> HandlerResult:
    """Rule 6, validated in the documented order, then rule 1."""
    validation.check_alter_partition(req)
    p = require_partition(image, req.topic, req.partition)
    require_broker(image, req.leader, req.broker_epoch)
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
    p = require_partition(image, req.topic, req.partition)
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
