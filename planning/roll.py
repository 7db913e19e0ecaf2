"""`plan_roll`: an order in which to restart every active broker, one at a time, that keeps
every partition at or above MinISR at every step; or the partitions that make it
impossible, and which brokers they block.

A roll restarts one broker and waits for its partitions to take it back into their ISRs
before the next. Each step here is that, stepped on a copy of the image through the
controller's core (`planning.whatif`): the broker's controlled shutdown, its clean
registration, the heartbeat that unfences it, and its leaders' AlterPartitions adding it
back to every ISR of a partition it hosts that has an active leader. The next step starts
from the image the last one left.

A broker may go when its controlled shutdown, stepped on the current image, leaves no
partition it changes below MinISR or without a leader (the classic rules keep a stopped
last member in the ISR: its lost leader blocks), and elects no leader uncleanly. A
partition already below MinISR whose ISR it is in blocks it too, even where an active
ELR member would take its place (the ISR would not shrink, but a member leaves an ISR
that refuses writes already: the roll does not touch such a partition until it is back
at MinISR).

The order is greedy: among the brokers that may go now, the one leading the fewest
partitions (the fewest leaders moved at that step), then the lowest id. Greedy loses
nothing: a step gives back every ISR membership it took and adds the ones its broker
lacked (a lagging replica rejoins once restarted), so ISRs only grow from step to step
(unless a step's ISR expansion completes a reassignment, which drops the replicas it
removes) and a broker that may go stays so. A blocked broker is looked at again when an
ISR that blocked it grew, and every one still blocked is checked again on the final
image, which the answer's `blocking` partitions come from. So the steps restart every
broker that any order could, and the blocked ones are blocked in every order.

Each step names its broker and the partitions to await back in its ISR (`awaits`):
what a later `metactl roll` follows, step by step.

Cost: one controlled shutdown, registration, unfence and ISR expansion per broker, plus
a shutdown for each check of a blocked broker; each O(the broker's partitions).

Pure: no IO, no clock; never changes the image it is given.
"""

from __future__ import annotations

from collections import Counter
from itertools import groupby

from controller.core.step import Rules, StepResult
from metadata_image.image import ClusterImage
from metadata_image.state import TopicPartition
from metadata_log.records import NO_LEADER, PartitionChangeRecord
from planning.restart import Planned, listed
from planning.whatif import WhatIf, merged
from protocol.messages.plan import (
    BlockingPartition,
    NotRolled,
    PlanRollResponse,
    RollStep,
    TopicPartitions,
)


def blocking(w: WhatIf, broker_id: int) -> tuple[frozenset[TopicPartition], StepResult]:
    """`broker_id`'s controlled shutdown stepped on `w` (which it advances), and the
    partitions that stop it: of those it changed, the ones whose ISR is below their
    MinISR once it applies, the ones it leaves without a leader (under the classic rules
    the ISR keeps its last member, stopped or not: the lost leader tells), and the ones
    it has elected uncleanly (the classic rules' unclean leader election)."""
    was_offline = w.image.offline
    shutdown = w.shut_down(broker_id)
    changed = shutdown.delta.partitions  # all of them the broker's
    offline = w.image.offline
    below = {
        p.tp
        for p in w.image.partitions_of(broker_id)  # a walk, not a lookup each
        if p.tp in changed
        and (len(p.isr) < p.min_isr or (p.tp in offline and p.tp not in was_offline))
    }
    # An unclean election at once (the classic rules' unclean.leader.election.enable).
    below.update((r.topic, r.partition) for r in shutdown.delta.unclean_recoveries)
    return frozenset(below), shutdown


def plan_roll(
    image: ClusterImage, *, rules: Rules, now_ms: int, limit: int | None = None
) -> PlanRollResponse:
    """The roll of every active broker of `image` (see the module docstring); each list
    holds at most `limit` partitions (None: all) and counts them all."""
    leads: Counter[int] = Counter()
    under: list[Planned] = []
    for p in image.partitions.values():
        if p.leader != NO_LEADER:
            leads[p.leader] += 1
        if len(p.isr) < p.min_isr:
            under.append(Planned(p, p))
    not_rolled = [
        NotRolled(broker_id=b.broker_id, reason="fenced" if b.fenced else "controlled_shutdown")
        for _, b in sorted(image.brokers.items())
        if not b.active
    ]
    remaining = {b for b in image.brokers if image.is_active(b)}
    # Brokers that may not go, with the partitions that stop them (as of their last look).
    blocked: dict[int, frozenset[TopicPartition]] = {}
    steps: list[RollStep] = []
    w = WhatIf(image, rules, now_ms)
    while remaining:
        chosen: tuple[int, WhatIf, StepResult] | None = None
        for b in sorted(remaining - blocked.keys(), key=lambda b: (leads[b], b)):
            trial = w.fork()
            below, shutdown = blocking(trial, b)
            if below:
                blocked[b] = below
                continue
            chosen = b, trial, shutdown
            break
        if chosen is None:
            # Nobody may go: each blocked broker looked at once more, on this image (what
            # the answer reports; one found free after all goes on).
            for b in sorted(blocked):
                blocked[b] = blocking(w.fork(), b)[0]
            if all(blocked.values()):
                break
            blocked = {b: below for b, below in blocked.items() if below}
            continue
        broker_id, trial, shutdown = chosen
        steps.append(
            _step(
                trial,
                broker_id,
                shutdown,
                before=w.image,
                leads=leads,
                blocked=blocked,
                limit=limit,
            )
        )
        remaining.discard(broker_id)
        w = trial
    return PlanRollResponse(
        end_offset=image.end_offset,
        steps=steps,
        blocked=sorted(remaining),
        blocking_count=len(set().union(*blocked.values())) if blocked else 0,
        blocking=_blocking_partitions(w.image, blocked, limit),
        not_rolled=not_rolled,
        under_min_isr=listed(under, limit),
    )


def _step(
    w: WhatIf,
    broker_id: int,
    shutdown: StepResult,
    *,
    before: ClusterImage,
    leads: Counter[int],
    blocked: dict[int, frozenset[TopicPartition]],
    limit: int | None,
) -> RollStep:
    """The rest of `broker_id`'s restart on `w`, whose image `before` its `shutdown`
    was: registration, unfence and its ISRs rejoined. Updates `leads` with the leaders
    that moved, and unblocks the brokers of `blocked` that an ISR that grew may free
    (they are looked at again)."""
    changed = shutdown.delta.partitions
    at_min = sum(
        1 for p in w.image.partitions_of(broker_id) if len(p.isr) == p.min_isr and p.tp in changed
    )
    lagging = {p.tp for p in before.partitions_of(broker_id) if broker_id not in p.isr}
    led = leads[broker_id]
    results = [
        shutdown,
        w.register_again(broker_id, clean=True),
        back := w.unfence(broker_id),
        *(rejoined := w.rejoin(broker_id)),
    ]
    # Leaders that moved (off the broker at its shutdown; onto it on its return, from
    # its ELR memberships), read off the records: a lookup per change of leader only.
    old = before.partitions
    led_by: dict[TopicPartition, int] = {}  # a second change of one partition: the first's
    for r in results:
        for rec in r.records:
            if isinstance(rec, PartitionChangeRecord) and rec.leader is not None:
                tp = (rec.topic, rec.partition)
                was = led_by.get(tp)
                if was is None:
                    was = old[tp].leader
                if was != NO_LEADER:
                    leads[was] -= 1
                if rec.leader != NO_LEADER:
                    leads[rec.leader] += 1
                led_by[tp] = rec.leader
    back_in = back.delta.partitions | merged(rejoined).partitions
    awaits = [
        p.tp for p in w.image.partitions_of(broker_id) if p.tp in back_in and broker_id in p.isr
    ]
    awaits.sort()
    # ISRs that grew: a replica that lagged before is back. Only those may free a
    # blocked broker (every other ISR is as it was).
    grown = lagging.intersection(awaits)
    for b in [b for b, below in blocked.items() if below & grown]:
        del blocked[b]
    return RollStep(
        broker_id=broker_id,
        leads=led,
        at_min_isr=at_min,
        await_count=len(awaits),
        awaits=grouped(awaits if limit is None else awaits[:limit]),
    )


def grouped(tps: list[TopicPartition]) -> list[TopicPartitions]:
    """Sorted partitions as runs of one topic each."""
    return [
        TopicPartitions(topic=topic, partitions=[i for _, i in run])
        for topic, run in groupby(tps, key=lambda tp: tp[0])
    ]


def _blocking_partitions(
    image: ClusterImage, blocked: dict[int, frozenset[TopicPartition]], limit: int | None
) -> list[BlockingPartition]:
    """Each partition that blocks a broker, as it is in `image`, with the brokers it
    blocks; the first `limit` (None: all) in (topic, partition) order."""
    blocks: dict[TopicPartition, list[int]] = {}
    for b in sorted(blocked):
        for tp in blocked[b]:
            blocks.setdefault(tp, []).append(b)
    ordered = sorted(blocks)
    shown = ordered if limit is None else ordered[:limit]
    out = []
    for tp in shown:
        p = image.partitions[tp]
        out.append(
            BlockingPartition(
                topic=p.topic,
                partition=p.partition,
                min_isr=p.min_isr,
                replicas=list(p.replicas),
                isr=sorted(p.isr),
                leader=p.leader,
                blocks=blocks[tp],
            )
        )
    return out
