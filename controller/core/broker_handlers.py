"""Pure handlers of a broker's lifecycle: register, fence, unfence, controlled shutdown
and heartbeat, each `(image, request, now_ms, config, budget) -> HandlerResult`, and the
sliced rest of their work on the broker's partitions (`Continue`, `continue_op`).

A broker-level record comes first (`Txn` applies it to a provisional image), then the
partition changes it entails, a work budget of partitions per slice
(`controller.core.work`): the first slice now, the rest as the result's `follow_up`, each
continuation re-reading its partitions so that the changes are exactly those the unsliced
operation would write. Every field is first checked against the range Kafka gives it
(`controller.core.validation`); a refusal raises a coded `MetactlError` before any record
exists.

Rules 2 (fence), 3 (registration, clean or unclean), 4 (unfence) and 5 (controlled
shutdown) of the controller issue live here, rule 1 through `partition_change`.
Unregistering a broker (`controller.core.lifecycle`) reuses this slicing.

Must not: read a clock, do IO, or change an image.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import msgspec

from controller.core import validation
from controller.core.config import ControllerConfig
from controller.core.handler_result import BrokerOp, Continue, HandlerResult
from controller.core.partition_change import build_change, remove_from_isrs, without_broker
from controller.core.work import PartitionPlan
from metactl.errors import (
    BrokerIdNotRegisteredError,
    DuplicateBrokerRegistrationError,
    StaleBrokerEpochError,
)
from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from metadata_image.state import PartitionState
from metadata_log.records import (
    NO_LEADER,
    BrokerRegistrationChangeRecord,
    ChangeReason,
    FenceBrokerRecord,
    MetadataRecord,
    PartitionChangeRecord,
    RegisterBrokerRecord,
    UnfenceBrokerRecord,
)
from protocol.messages.broker_controller import (
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.messages.internal import (
    Ack,
    ControlledShutdown,
    ControlledShutdownResponse,
    FenceBroker,
    UnfenceBroker,
)
from protocol.messages.unions import ControllerResponse


class Txn:
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


def require_broker(image: ClusterImage, broker_id: int, epoch: int | None = None) -> None:
    b = image.broker(broker_id)
    if b is None:
        raise BrokerIdNotRegisteredError(f"broker {broker_id} is not registered")
    if epoch is not None and epoch != b.epoch:
        raise StaleBrokerEpochError(
            f"broker {broker_id} presented epoch {epoch}, the current epoch is {b.epoch}"
        )


def _fence_changes(
    txn: Txn, broker_id: int, reason: ChangeReason, config: ControllerConfig
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


def broker_op(
    txn: Txn,
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
    require_broker(image, req.broker_id)
    b = image.brokers[req.broker_id]
    if b.fenced:
        return HandlerResult([], Ack())
    txn = Txn(image)
    txn.broker_record(
        FenceBrokerRecord(broker_id=b.broker_id, broker_epoch=b.epoch, reason=req.reason)
    )
    return broker_op(txn, BrokerOp.FENCE, b.broker_id, Ack(), config=config, budget=budget)


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
    txn = Txn(image)
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
            kafka_endpoint=req.kafka_endpoint,
            rack=req.rack,
            previous_epoch=req.previous_epoch,
            clean=clean,
            fenced=True,
        )
    )
    response = RegisterBrokerResponse(broker_epoch=epoch, clean=clean)
    if not clean:
        return broker_op(
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
    require_broker(image, req.broker_id, req.broker_epoch)
    b = image.brokers[req.broker_id]
    if not b.fenced:
        return HandlerResult([], Ack())
    txn = Txn(image)
    txn.broker_record(UnfenceBrokerRecord(broker_id=b.broker_id, broker_epoch=b.epoch))
    return broker_op(txn, BrokerOp.UNFENCE, b.broker_id, Ack(), config=config, budget=budget)


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
    require_broker(image, req.broker_id, req.broker_epoch)
    b = image.brokers[req.broker_id]
    if b.in_controlled_shutdown:
        # Its shutdown's changes are committed (they are one transaction with the record
        # that set the flag), and they moved leadership off every partition it led; no
        # election ever picks an inactive broker (rules 2, 7, 8), so it leads nothing.
        return HandlerResult([], ControlledShutdownResponse(can_stop=True))
    txn = Txn(image)
    txn.broker_record(
        BrokerRegistrationChangeRecord(
            broker_id=b.broker_id, broker_epoch=b.epoch, in_controlled_shutdown=True
        )
    )
    return broker_op(
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
