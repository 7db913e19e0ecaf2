"""The recovery tracker: pending unclean recoveries as pure soft state.

`evaluate(image, tracker, now_ms, ...)` looks at leaderless partitions and the pending
recoveries, asks each partition's policy what to do, and returns the records of the
recoveries decided now, the log inspections to send (GetReplicaLogInfo), the next
deadline, and the new tracker. Answers come back through `record_answer`. An operator's
unclean election goes through `manual_election`.

Evaluation is incremental: a pass looks only at the partitions it is given (`scope`:
those an event may have changed, a work budget at a time, see `controller.core.work`),
those with a log-inspection answer not yet looked at (`RecoveryTracker.answered`), and
those whose wake-up time has come (`RecoveryTracker.wakes`: a window's end, or a
policy's `Wait(until_ms)`). A policy's decision may therefore depend only on the
partition, the state of the brokers that host it, the answers and the time; anything
else would not be looked at again. `evaluate_all` is the full pass the property tests
compare it with.

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
    Wait,
)
from metactl.errors import (
    ElectionNotNeededError,
    IneligibleReplicaError,
    InvalidRequestError,
    StaleBrokerEpochError,
    UnknownTopicOrPartitionError,
)
from metadata_image.image import ClusterImage
from metadata_image.state import PartitionState, TopicPartition
from metadata_log.records import (
    ChangeReason,
    ElectionKind,
    MetadataRecord,
    RecoveryCandidate,
    UncleanRecoveryRecord,
)
from protocol.messages.admin import ElectLeader
from protocol.messages.internal import ReplicaLogInfo


class RecoveryTracker(msgspec.Struct, frozen=True):
    pending: immutables.Map[TopicPartition, PendingRecovery] = immutables.Map()
    # Leaderless partitions: (the leader epoch the leader was lost at, when). A note whose
    # epoch is not the partition's current one is from an earlier outage.
    offline: immutables.Map[TopicPartition, tuple[int, int]] = immutables.Map()
    # When to look at a pending recovery again with nothing else changed (its window's
    # end, or a policy's Wait(until_ms)): time -> partitions, and each partition's time.
    wakes: immutables.Map[int, immutables.Map[TopicPartition, None]] = immutables.Map()
    wake_of: immutables.Map[TopicPartition, int] = immutables.Map()
    next_wake: int | None = None  # min(wakes), kept so that no step scans them
    # Partitions with a log-inspection answer the next pass must look at.
    answered: frozenset[TopicPartition] = frozenset()

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
    at_ms: int | None = None,
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
            at_ms=at_ms,
        ),
        change,
    ]


class _Wakes:
    """The tracker's wake-ups while one pass changes them: O(log n) per partition, and
    the earliest time recomputed (O(distinct times)) only when it was removed."""

    def __init__(self, tracker: RecoveryTracker) -> None:
        self.before = tracker.wakes
        self.wakes = tracker.wakes.mutate()
        self.wake_of = tracker.wake_of.mutate()
        self.next: int | None = tracker.next_wake
        self.stale = False

    def clear(self, tp: TopicPartition) -> None:
        when = self.wake_of.pop(tp, None)
        if when is None:
            return
        bucket = self.wakes[when].delete(tp)
        if len(bucket):
            self.wakes[when] = bucket
        else:
            del self.wakes[when]
            self.stale = self.stale or when == self.next

    def set(self, tp: TopicPartition, when: int) -> None:
        self.clear(tp)
        self.wake_of[tp] = when
        self.wakes[when] = self.wakes.get(when, immutables.Map()).set(tp, None)
        if self.next is None or when < self.next:
            self.next = when

    def due(self, now_ms: int) -> list[TopicPartition]:
        out: list[TopicPartition] = []
        for when in sorted(t for t in self.before if t <= now_ms):
            for tp in sorted(self.wakes.pop(when).keys()):
                del self.wake_of[tp]
                out.append(tp)
            self.stale = True
        return out

    def finish(self, tracker: RecoveryTracker) -> RecoveryTracker:
        wakes = self.wakes.finish()
        nxt = self.next
        if self.stale:
            nxt = min(wakes.keys()) if len(wakes) else None
        return msgspec.structs.replace(
            tracker, wakes=wakes, wake_of=self.wake_of.finish(), next_wake=nxt
        )


def take_due(tracker: RecoveryTracker, now_ms: int) -> tuple[list[TopicPartition], RecoveryTracker]:
    """The partitions whose wake-up time has come (for the step to queue: a million
    recoveries may share one deadline), and the tracker without their wake-ups. O(1)
    when none is due; else O(due + distinct wake times)."""
    if tracker.next_wake is None or tracker.next_wake > now_ms:
        return [], tracker
    w = _Wakes(tracker)
    due = w.due(now_ms)
    return due, w.finish(tracker)


def evaluate_all(
    image: ClusterImage,
    tracker: RecoveryTracker,
    now_ms: int,
    *,
    policies: Mapping[str, RecoveryPolicy],
    config: ControllerConfig,
) -> RecoveryStep:
    """The full pass: every leaderless partition and every pending recovery. What
    `evaluate` over the partitions an event changed must agree with (a property test)."""
    scope = [*image.offline, *tracker.pending]
    return evaluate(image, tracker, now_ms, policies=policies, config=config, scope=scope)


def evaluate(
    image: ClusterImage,
    tracker: RecoveryTracker,
    now_ms: int,
    *,
    policies: Mapping[str, RecoveryPolicy],
    config: ControllerConfig,
    scope: Iterable[TopicPartition],
) -> RecoveryStep:
    """One evaluation pass over `scope` and the answered partitions (the step queues the
    due wake-ups, `take_due`, with what it evaluates):
    note when each leaderless one lost its leader, drop recoveries no longer needed,
    start those a policy asks for, then decide or ask for the logs still missing. Costs
    O(partitions looked at), whatever the number of pending recoveries."""
    records: list[MetadataRecord] = []
    inspections: list[Inspection] = []

    def policy_of(topic: str) -> RecoveryPolicy | None:
        if not image.elr_enabled(config.eligible_leader_replicas):
            # Classic rules: no KIP-966 recovery; Kafka's unclean election if enabled.
            return CLASSIC_UNCLEAN if config.unclean_leader_election else None
        return policies.get(strategy_for(image, topic, config))

    # In a fixed order (not hash order), so that a seeded simulation replays exactly.
    look = sorted({*scope, *tracker.answered})
    wakes = _Wakes(tracker)
    pending = tracker.pending.mutate()
    offline = tracker.offline.mutate()
    parts = image.partitions
    # The notes of one pass share their (leader epoch, time) tuples: a million partitions
    # that lost their leader at once are noted by a handful of objects, not a million.
    notes: dict[int, tuple[int, int]] = {}
    for looked in look:
        wakes.clear(looked)
        p = parts.get(looked)
        if p is None or p.has_leader:
            # Led again (or gone): nothing to recover, nothing to note.
            pending.pop(looked, None)
            offline.pop(looked, None)
            continue
        # Kept under the partition's own (topic, partition) tuple, which the image shares
        # with every state of it, not the one the scope built.
        tp = p.tp
        since = tracker.offline_since(p)
        if since is None:
            since = now_ms
            note = notes.get(p.leader_epoch)
            if note is None:
                note = notes[p.leader_epoch] = (p.leader_epoch, now_ms)
            offline[tp] = note
        policy = policy_of(p.topic)
        reason = policy.trigger(image, p) if policy is not None else None
        pr = pending.get(tp)
        if policy is None or reason is None:
            # A clean election (or anything else) made it unnecessary, or none is needed.
            if pr is not None:
                del pending[tp]
            continue
        if pr is None:
            window = policy.window_ms(config.unclean_recovery_window_ms)
            pr = PendingRecovery(
                topic=p.topic,
                partition=p.partition,
                strategy=policy.name,
                trigger=reason,
                since_ms=since,
                started_ms=now_ms,
                deadline_ms=None if window is None else now_ms + window,
            )
        decided = _decide(image, p, pr, now_ms, policies=policies, config=config)
        if isinstance(decided, list):
            records.extend(decided)
            pending.pop(tp, None)
            offline.pop(tp, None)  # it has a leader now
            continue
        pr, wake, asked = decided
        inspections.extend(asked)
        pending[tp] = pr
        if wake is not None and wake > now_ms:
            wakes.set(tp, wake)
    after = wakes.finish(RecoveryTracker(pending.finish(), offline.finish(), answered=frozenset()))
    return RecoveryStep(
        records=records, tracker=after, inspections=inspections, next_deadline_ms=after.next_wake
    )


def _decide(
    image: ClusterImage,
    p: PartitionState,
    pr: PendingRecovery,
    now_ms: int,
    *,
    policies: Mapping[str, RecoveryPolicy],
    config: ControllerConfig,
) -> list[MetadataRecord] | tuple[PendingRecovery, int | None, list[Inspection]]:
    """One pending recovery: its records if the policy chooses now, else the recovery
    (window restarted, inspections noted), when to look again, and whom to ask."""
    policy = policy_named(policies, pr.strategy)
    decision = policy.decide(image, p, pr, now_ms)
    if isinstance(decision, Choose):
        members = policy.candidates(image, p)
        return recovery_records(
            image,
            p,
            decision.broker_id,
            strategy=pr.strategy,
            candidates=[a for a in pr.valid_answers(image) if a.broker_id in members],
            trigger=pr.trigger,
            since_ms=pr.since_ms,
            election=ElectionKind.UNCLEAN_RECOVERY,
            at_ms=now_ms,
        )
    if isinstance(decision, RestartWindow):
        window = policy.window_ms(config.unclean_recovery_window_ms) or 0
        pr = msgspec.structs.replace(
            pr,
            started_ms=now_ms,
            deadline_ms=now_ms + window,
            requested=immutables.Map(),
        )
    answered = {a.broker_id for a in pr.valid_answers(image)}
    members = policy.candidates(image, p)
    requested = pr.requested.mutate()
    asked: list[Inspection] = []
    for r in p.replicas:
        b = image.brokers.get(r)
        if (
            r in members
            and b is not None
            and b.active
            and r not in answered
            and requested.get(r) != b.epoch
        ):
            asked.append(
                Inspection(broker_id=r, broker_epoch=b.epoch, topic=p.topic, partition=p.partition)
            )
            requested[r] = b.epoch
    if asked:  # otherwise the map is unchanged: keep the one it has (a new map each pass)
        pr = msgspec.structs.replace(pr, requested=_shared(requested.finish()))
    wake = pr.deadline_ms
    if isinstance(decision, Wait) and decision.until_ms is not None:
        wake = decision.until_ms if wake is None else min(wake, decision.until_ms)
    return pr, wake, asked


_REQUESTED: dict[tuple[tuple[int, int], ...], immutables.Map[int, int]] = {}
_REQUESTED_LIMIT = 1 << 12


def _shared(requested: immutables.Map[int, int]) -> immutables.Map[int, int]:
    """One map per distinct content: a recovery of each of a million partitions asks the
    same broker at the same epoch, and a map each was about 140 bytes a partition."""
    key = tuple(sorted(requested.items()))
    shared = _REQUESTED.get(key)
    if shared is None:
        if len(_REQUESTED) >= _REQUESTED_LIMIT:
            _REQUESTED.clear()
        shared = _REQUESTED[key] = requested
    return shared


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
    return msgspec.structs.replace(
        tracker, pending=tracker.pending.set(tp, pr), answered=tracker.answered | {tp}
    )


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
        at_ms=now_ms,
    )
    offline = tracker.offline.mutate()
    offline.pop(p.tp, None)  # it has a leader now
    return records, msgspec.structs.replace(
        tracker,
        pending=tracker.pending.delete(p.tp) if pr is not None else tracker.pending,
        offline=offline.finish(),
    )
