"""`plan_restart`: what a restart of one broker would do to its partitions, now, clean and
unclean, by stepping a copy of the image through the controller's core (`planning.whatif`).

A clean restart is the broker's controlled shutdown (rule 5), then its registration with
the epoch it had (clean, rule 3) and the heartbeat that unfences it (rule 4). An unclean
one is a crash: the FenceBroker its session's expiry causes (rule 2), then a registration
without its epoch (unclean: Unclean Exclusion moves its ELR memberships to the
LastKnownELR) and the unfencing heartbeat. The broker's catching up afterwards (its
leaders' AlterPartitions) is the roll's business (`planning.roll`), not a restart's: here
it is back, not yet in sync.

Each case compares the partitions the events changed, before and after:

* `under_min_isr`: below MinISR while the broker is down (of those its going changed);
* `leader_lost`: had a leader, and none while it is down;
* `elected_from_elr`: given a leader from the ELR (ElectionKind.ELR): while it is down
  (case B: the ISR emptied and an active ELR member took over) or on its return (rule 4:
  it was the ELR member);
* `unclean_recovery`: a recovery the tracker has pending (or decided: a classic unclean
  election) while it is down or after its return, or no leader and no ISR or ELR left
  after its return, with what the partition's policy needs (`RecoveryNeed`).

Pure: no IO, no clock; never changes the image it is given.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from controller.core import validation
from controller.core.recovery.policy import PendingRecovery
from controller.core.recovery.tracker import RecoveryTracker, policy_named, strategy_for
from controller.core.step import Rules, StepResult
from metadata_image.image import ClusterImage, common
from metadata_image.state import PartitionState, TopicPartition
from metadata_log.records import ElectionKind, UncleanRecoveryRecord
from planning.whatif import WhatIf, active_broker, merged
from protocol.messages.plan import (
    PartitionList,
    PlannedPartition,
    PlanRestartResponse,
    RecoveryNeed,
    RestartCase,
)


def plan_restart(
    image: ClusterImage, broker_id: int, *, rules: Rules, now_ms: int, limit: int | None = None
) -> PlanRestartResponse:
    """Both restarts of `broker_id` against `image`; each list holds at most `limit`
    partitions (None: all), in (topic, partition) order, and counts them all.
    BROKER_ID_NOT_REGISTERED for an unknown broker; INVALID_REQUEST for one that is
    down or stopping already (there is nothing to restart)."""
    validation.broker_id(broker_id)
    active_broker(image, broker_id)
    hosted = list(image.partitions_of(broker_id))
    return PlanRestartResponse(
        broker_id=broker_id,
        end_offset=image.end_offset,
        replicas=len(hosted),
        leads=sum(1 for p in hosted if p.leader == broker_id),
        clean=restart_case(image, broker_id, "clean", rules=rules, now_ms=now_ms, limit=limit),
        unclean=restart_case(image, broker_id, "unclean", rules=rules, now_ms=now_ms, limit=limit),
    )


def restart_case(
    image: ClusterImage,
    broker_id: int,
    kind: Literal["clean", "unclean"],
    *,
    rules: Rules,
    now_ms: int,
    limit: int | None,
) -> RestartCase:
    """One restart of `broker_id`, stepped on a copy of `image`, and its four lists."""
    w = WhatIf(image, rules, now_ms)
    clean = kind == "clean"
    if clean:
        going = w.shut_down(broker_id)
        steps = [f"controlled shutdown of broker {broker_id}"]
    else:
        going = w.crash(broker_id)
        steps = [f"fence of broker {broker_id} (its session timed out)"]
    down = w.state
    back_results = [w.register_again(broker_id, clean=clean), w.unfence(broker_id)]
    steps += [
        f"{kind} registration of broker {broker_id}",
        f"unfence of broker {broker_id} (its heartbeat, caught up with the log)",
    ]
    back = w.state
    returning = merged(back_results)
    changed = going.delta.partitions | returning.partitions

    before, mid_parts, back_parts = image.partitions, down.image.partitions, back.image.partitions
    was_offline, now_offline = image.offline, down.image.offline
    under: list[Planned] = []
    lost: list[Planned] = []
    gone = going.delta.partitions  # all of them the broker's (its ISRs, its leaderless)
    for m in down.image.partitions_of(broker_id):  # a walk, not a lookup each
        tp = m.tp
        if tp not in gone:
            continue
        if len(m.isr) < m.min_isr:
            under.append(Planned(before[tp], m))
        if tp in now_offline and tp not in was_offline:
            lost.append(Planned(before[tp], m))
    from_elr: dict[TopicPartition, Planned] = {}
    for e in going.delta.elections:
        if e.kind is ElectionKind.ELR:
            from_elr.setdefault(e.tp, Planned(before[e.tp], mid_parts[e.tp], election="elr"))
    for e in returning.elections:
        if e.kind is ElectionKind.ELR:
            from_elr.setdefault(
                e.tp, Planned(before[e.tp], back_parts[e.tp], election="elr", on_return=True)
            )
    recoveries = _recoveries(
        image, changed, down=(down.image, down.tracker), back=(back.image, back.tracker),
        decided=[*_decided(going), *(rec for r in back_results for rec in _decided(r))],
        rules=rules,
    )  # fmt: skip
    return RestartCase(
        kind=kind,
        steps=steps,
        under_min_isr=listed(under, limit),
        leader_lost=listed(lost, limit),
        elected_from_elr=listed(from_elr.values(), limit),
        unclean_recovery=listed(recoveries, limit),
    )


class Planned:
    """A partition before and after, and how it was led after (what `PlannedPartition`
    shows), kept unencoded until the list is cut to its limit."""

    __slots__ = ("after", "before", "election", "on_return", "recovery")

    def __init__(
        self,
        before: PartitionState,
        after: PartitionState,
        *,
        election: str | None = None,
        on_return: bool = False,
        recovery: RecoveryNeed | None = None,
    ) -> None:
        self.before, self.after = before, after
        self.election, self.on_return, self.recovery = election, on_return, recovery

    def key(self) -> TopicPartition:
        return self.before.tp

    def encoded(self) -> PlannedPartition:
        b, a = self.before, self.after
        return PlannedPartition(
            topic=b.topic,
            partition=b.partition,
            min_isr=a.min_isr,
            replicas=list(a.replicas),
            leader_before=b.leader,
            isr_before=sorted(b.isr),
            leader=a.leader,
            isr=sorted(a.isr),
            elr=sorted(a.elr),
            last_known_elr=sorted(a.last_known_elr),
            election=self.election,
            on_return=self.on_return,
            recovery=self.recovery,
        )


def listed(items: Iterable[Planned], limit: int | None) -> PartitionList:
    """`items` counted, the first `limit` (None: all) listed in (topic, partition) order."""
    ordered = sorted(items, key=Planned.key)
    shown = ordered if limit is None else ordered[:limit]
    return PartitionList(count=len(ordered), partitions=[i.encoded() for i in shown])


def _decided(result: StepResult) -> list[UncleanRecoveryRecord]:
    return list(result.delta.unclean_recoveries)


def _recoveries(
    image: ClusterImage,
    changed: set[TopicPartition],
    *,
    down: tuple[ClusterImage, RecoveryTracker],
    back: tuple[ClusterImage, RecoveryTracker],
    decided: list[UncleanRecoveryRecord],
    rules: Rules,
) -> list[Planned]:
    """The partitions of `changed` that need (or got) an unclean recovery during the
    restart, each with what its policy needs, read off the tracker the step left."""
    (down_image, down_tracker), (back_image, back_tracker) = down, back
    chosen = {(r.topic, r.partition): r for r in decided}
    pending_down, pending_back = down_tracker.pending, back_tracker.pending
    policies = rules.policies
    out: list[Planned] = []
    # Only these can be (recovered, pending, or leaderless after the return): a look at
    # each, not at every partition the restart changed.
    looks = {*chosen, *pending_down.keys(), *pending_back.keys()}
    looks.update(common(changed, back_image.offline))  # walks the smaller of the two
    for tp in sorted(looks & changed):
        after = back_image.partitions[tp]
        record = chosen.get(tp)
        if record is not None:
            need = RecoveryNeed(
                strategy=record.strategy, trigger=record.trigger or None, chosen=record.chosen
            )
            out.append(
                Planned(image.partitions[tp], after, election="unclean_recovery", recovery=need)
            )
            continue
        pr: PendingRecovery | None = pending_back.get(tp)
        at_image, at_tracker = back_image, back_tracker
        if pr is None:
            pr = pending_down.get(tp)
            at_image, at_tracker = down_image, down_tracker
        if pr is not None:
            p = at_image.partitions[tp]
            # Pending only while the broker is down: its return elected a leader cleanly
            # (the entry then shows the partition while it is down).
            until_return = at_tracker is down_tracker and after.has_leader
            need = RecoveryNeed(
                strategy=pr.strategy,
                trigger=pr.trigger,
                awaiting=at_tracker.awaited(at_image, tp, policies) or [],
                window_ms=None if pr.deadline_ms is None else pr.deadline_ms - pr.started_ms,
                until_return=until_return,
                operator=not policy_named(policies, pr.strategy).candidates(at_image, p),
            )
            shown = p if until_return else after
            out.append(Planned(image.partitions[tp], shown, recovery=need))
        elif not after.has_leader and not after.isr and not after.elr:
            # No policy acts (manual): only an operator's unclean election gives it a
            # leader.
            need = RecoveryNeed(strategy=_strategy(back_image, tp[0], rules), operator=True)
            out.append(Planned(image.partitions[tp], after, recovery=need))
    return out


def _strategy(image: ClusterImage, topic: str, rules: Rules) -> str:
    """The topic's unclean-recovery strategy; "classic" under the classic rules."""
    if not image.elr_enabled(rules.config.eligible_leader_replicas):
        return "classic"
    return strategy_for(image, topic, rules.config)
