"""The recovery tracker: pending unclean recoveries as pure soft state.

`evaluate(image, tracker, now_ms, ...)` looks at leaderless partitions and the pending
recoveries, asks each partition's policy what to do, and returns the records of the
recoveries decided now, the log inspections to send (GetReplicaLogInfo), the next
deadline, and the new tracker. Answers come back through `record_answer`. An operator's
unclean election goes through `manual_election`.

Pending recoveries are not logged: after a controller restart they start over, as in
Kafka's draft (a proactive window restarts at the new start time). Every decided
recovery writes an UncleanRecoveryRecord and a PartitionChangeRecord that makes the
chosen replica the sole ISR member and leader, with the partition `recovering`.

The record's `offline_since_ms` is when the partition lost its last leader, not when a
recovery became pending (which may be much later: balanced waits for the ELR to empty).
The tracker notes that time for every leaderless partition it evaluates, keyed by the
leader epoch of the loss: any leader change bumps the epoch, so a note left from an
earlier outage is recognised and replaced. Like pending recoveries it is soft state: after
a controller restart a partition already leaderless counts from the restart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import immutables
import msgspec

from controller.core.config import ControllerConfig
from controller.core.partition_change import build_change
from controller.core.recovery.builtin import CLASSIC_UNCLEAN
from controller.core.recovery.policy import (
    Choose,
    PendingRecovery,
    RecoveryPolicy,
    RestartWindow,
)
from metactl.errors import (
    ElectionNotNeededError,
    IneligibleReplicaError,
    InvalidRequestError,
    StaleBrokerEpochError,
    UnknownTopicOrPartitionError,
)
from metadata_image.image import ClusterImage, PartitionState, TopicPartition
from metadata_log.records import (
    ChangeReason,
    ElectionKind,
    MetadataRecord,
    RecoveryCandidate,
    UncleanRecoveryRecord,
)
from protocol.messages import ElectLeader, ReplicaLogInfo


class RecoveryTracker(msgspec.Struct, frozen=True):
    pending: immutables.Map[TopicPartition, PendingRecovery] = immutables.Map()
    # Leaderless partitions: (the leader epoch the leader was lost at, when). A note whose
    # epoch is not the partition's current one is from an earlier outage.
    offline: immutables.Map[TopicPartition, tuple[int, int]] = immutables.Map()

    def offline_since(self, p: PartitionState) -> int | None:
        """When `p` lost its last leader, if it is leaderless and that was noted."""
        note = self.offline.get(p.tp)
        if note is None or p.has_leader or note[0] != p.leader_epoch:
            return None
        return note[1]

    def awaited(
        self, image: ClusterImage, tp: TopicPartition, policies: Mapping[str, RecoveryPolicy]
    ) -> list[int] | None:
        """Candidates whose answer is still awaited, or None when no recovery is pending."""
        pr = self.pending.get(tp)
        if pr is None:
            return None
        p = image.partitions[tp]
        members = policy_named(policies, pr.strategy).candidates(image, p)
        answered = {a.broker_id for a in pr.valid_answers(image)}
        return [r for r in p.replicas if r in members and r not in answered]


class Inspection(msgspec.Struct, frozen=True, kw_only=True):
    """Ask `broker_id` (at `broker_epoch`) for its log of topic-partition."""

    broker_id: int
    broker_epoch: int
    topic: str
    partition: int


class RecoveryStep(msgspec.Struct, frozen=True, kw_only=True):
    records: list[MetadataRecord]
    tracker: RecoveryTracker
    inspections: list[Inspection]
    next_deadline_ms: int | None


def policy_named(policies: Mapping[str, RecoveryPolicy], name: str) -> RecoveryPolicy:
    """A pending recovery's policy: a registered strategy, or the classic unclean election."""
    return CLASSIC_UNCLEAN if name == CLASSIC_UNCLEAN.name else policies[name]


def strategy_for(image: ClusterImage, topic: str, config: ControllerConfig) -> str:
    t = image.topics.get(topic)
    if t is not None and t.recovery_strategy:
        return t.recovery_strategy
    return config.unclean_recovery_strategy


def recovery_records(
    image: ClusterImage,
    p: PartitionState,
    chosen: int,
    *,
    strategy: str,
    candidates: list[RecoveryCandidate],
    trigger: str,
    since_ms: int | None,
    election: ElectionKind,
) -> list[MetadataRecord]:
    order = {r: i for i, r in enumerate(p.replicas)}
    change = build_change(
        image,
        p,
        reason=ChangeReason.UNCLEAN_RECOVERY,
        elect=(chosen, election),
    )
    assert change is not None  # a leaderless partition always changes leader
    return [
        UncleanRecoveryRecord(
            topic=p.topic,
            partition=p.partition,
            strategy=strategy,
            candidates=sorted(candidates, key=lambda c: order.get(c.broker_id, len(order))),
            chosen=chosen,
            potential_data_loss=True,
            trigger=trigger,
            offline_since_ms=since_ms,
        ),
        change,
    ]


def evaluate(
    image: ClusterImage,
    tracker: RecoveryTracker,
    now_ms: int,
    *,
    policies: Mapping[str, RecoveryPolicy],
    config: ControllerConfig,
    touched: Iterable[TopicPartition] | None = None,
) -> RecoveryStep:
    """One evaluation pass. `touched` limits the search for *new* recoveries to the
    partitions an event may have changed (None: every leaderless partition, as after a
    restart); pending recoveries are always re-evaluated."""
    records: list[MetadataRecord] = []
    inspections: list[Inspection] = []
    deadline: int | None = None

    def policy_of(topic: str) -> RecoveryPolicy | None:
        if not config.eligible_leader_replicas:
            # Classic rules: no KIP-966 recovery; Kafka's unclean election if enabled.
            return CLASSIC_UNCLEAN if config.unclean_leader_election else None
        return policies.get(strategy_for(image, topic, config))

    # Pending recoveries are few (leaderless partitions), so a plain dict is the builder.
    pending: dict[TopicPartition, PendingRecovery] = dict(tracker.pending.items())
    # Drop recoveries that a clean election (or anything else) made unnecessary.
    for tp in tracker.pending:
        p = image.partitions.get(tp)
        policy = policy_of(tp[0])
        if p is None or policy is None or policy.trigger(image, p) is None:
            del pending[tp]
    # Note when each leaderless partition in scope lost its leader; then start recoveries
    # for those whose policy asks for one.
    if touched is None:
        candidates = list(image.offline_partitions())
        # A full look (a fresh controller): notes of partitions since led are dropped.
        offline = immutables.Map[TopicPartition, tuple[int, int]]().mutate()
    else:
        candidates = [image.partitions[tp] for tp in set(touched) if tp in image.offline]
        offline = tracker.offline.mutate()
    for p in candidates:
        since = tracker.offline_since(p)
        if since is None or touched is None:  # else its note is there already, unchanged
            offline[p.tp] = (p.leader_epoch, now_ms if since is None else since)
    for p in candidates:
        if p.tp in pending:
            continue
        policy = policy_of(p.topic)
        reason = policy.trigger(image, p) if policy is not None else None
        if policy is None or reason is None:
            continue
        window = policy.window_ms(config.unclean_recovery_window_ms)
        pending[p.tp] = PendingRecovery(
            topic=p.topic,
            partition=p.partition,
            strategy=policy.name,
            trigger=reason,
            since_ms=offline[p.tp][1],
            started_ms=now_ms,
            deadline_ms=None if window is None else now_ms + window,
        )
    # Decide, or ask for the logs still missing.
    for tp in list(pending):
        pr = pending[tp]
        p = image.partitions[tp]
        policy = policy_named(policies, pr.strategy)
        decision = policy.decide(image, p, pr, now_ms)
        if isinstance(decision, Choose):
            members = policy.candidates(image, p)
            records.extend(
                recovery_records(
                    image,
                    p,
                    decision.broker_id,
                    strategy=pr.strategy,
                    candidates=[a for a in pr.valid_answers(image) if a.broker_id in members],
                    trigger=pr.trigger,
                    since_ms=pr.since_ms,
                    election=ElectionKind.UNCLEAN_RECOVERY,
                )
            )
            del pending[tp]
            offline.pop(tp, None)  # it has a leader now
            continue
        if isinstance(decision, RestartWindow):
            window = policy.window_ms(config.unclean_recovery_window_ms) or 0
            pr = msgspec.structs.replace(
                pr,
                started_ms=now_ms,
                deadline_ms=now_ms + window,
                requested=immutables.Map(),
            )
        answered = {a.broker_id for a in pr.valid_answers(image)}
        requested = pr.requested.mutate()
        for r in p.replicas:
            b = image.brokers.get(r)
            if (
                r in policy.candidates(image, p)
                and b is not None
                and b.active
                and r not in answered
                and requested.get(r) != b.epoch
            ):
                inspections.append(
                    Inspection(
                        broker_id=r, broker_epoch=b.epoch, topic=p.topic, partition=p.partition
                    )
                )
                requested[r] = b.epoch
        pr = msgspec.structs.replace(pr, requested=requested.finish())
        pending[tp] = pr
        if pr.deadline_ms is not None and (deadline is None or pr.deadline_ms < deadline):
            deadline = pr.deadline_ms
    return RecoveryStep(
        records=records,
        tracker=RecoveryTracker(immutables.Map(pending), offline.finish()),
        inspections=inspections,
        next_deadline_ms=deadline,
    )


def record_answer(
    image: ClusterImage, tracker: RecoveryTracker, reply: ReplicaLogInfo
) -> RecoveryTracker:
    """Keep a log-inspection answer, if it is from the broker's current incarnation."""
    b = image.broker(reply.broker_id)
    if b is None or b.epoch != reply.broker_epoch:
        current = "unregistered" if b is None else f"current epoch {b.epoch}"
        raise StaleBrokerEpochError(
            f"log info from broker {reply.broker_id} at epoch {reply.broker_epoch} ({current})"
        )
    tp = (reply.topic, reply.partition)
    pr = tracker.pending.get(tp)
    if pr is None:
        return tracker  # a late answer for a recovery that is over
    answer = RecoveryCandidate(
        broker_id=reply.broker_id,
        last_leader_epoch=reply.last_leader_epoch,
        log_end_offset=reply.log_end_offset,
        broker_epoch=reply.broker_epoch,
    )
    pr = msgspec.structs.replace(pr, answers=pr.answers.set(reply.broker_id, answer))
    return msgspec.structs.replace(tracker, pending=tracker.pending.set(tp, pr))


def manual_election(
    image: ClusterImage, tracker: RecoveryTracker, req: ElectLeader, now_ms: int
) -> tuple[list[MetadataRecord], RecoveryTracker]:
    """An operator's unclean election of a named replica: always a potential data loss."""
    p = image.partition((req.topic, req.partition))
    if p is None:
        raise UnknownTopicOrPartitionError(f"unknown partition {req.topic}-{req.partition}")
    if p.has_leader:
        raise ElectionNotNeededError(f"{req.topic}-{req.partition} has leader {p.leader}")
    if req.replica is None:
        raise InvalidRequestError("an unclean election names the replica to elect")
    if req.replica not in p.replicas or not image.is_active(req.replica):
        raise IneligibleReplicaError(
            f"replica {req.replica} of {req.topic}-{req.partition} is not an active replica"
        )
    pr = tracker.pending.get(p.tp)
    records = recovery_records(
        image,
        p,
        req.replica,
        strategy="manual",
        candidates=pr.valid_answers(image) if pr is not None else [],
        trigger="operator",
        since_ms=tracker.offline_since(p),
        election=ElectionKind.MANUAL,
    )
    offline = tracker.offline.mutate()
    offline.pop(p.tp, None)  # it has a leader now
    return records, RecoveryTracker(
        tracker.pending.delete(p.tp) if pr is not None else tracker.pending, offline.finish()
    )
