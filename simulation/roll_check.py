"""The roll checker (issue 34): follow a roll plan through the controller's core, as the
brokers and the operator would carry it out, and check MinISR after every core step.

`check_roll(image, steps, rules=...)` runs each `RollStep` of a plan (`metactl plan
roll`, `planning.roll`) on a `ControllerState` of `image`, exactly as the driver steps
events (`controller.core.step.step`, with the controller's work budget: large work in
slices, each slice a step, then the Ticks that drain the recovery backlog):

1. the broker's heartbeat asking for a controlled shutdown (rule 5);
2. its registration again with the epoch it had (a clean restart, rule 3) and the
   heartbeat that unfences it (rule 4);
3. every active leader's AlterPartitions taking it back into the ISR of each partition
   it hosts, in pieces of at most a work budget of items (as the service cuts a broker's
   batch), once its replicas have caught up (rule 6);
4. the plan's `awaits`: each must have the broker in its ISR now, or the roll would wait
   for ever (a `Missing`).

After every core step, every partition the step changed must be at or above MinISR, or
have an ISR that only grew in that step (a roll cannot mend a partition below MinISR at
once, but must never take a member out of its ISR), and must not have lost its leader
(the classic rules keep a stopped last member in the ISR), not even to an unclean
election (the classic rules' unclean.leader.election.enable): anything else is a
`Violation`,
naming the step, the event and the partition. A broker that is not up at its step (the
plan names one that is down, stopping or unknown) or a request the core refuses is
`refused`, and the roll stops there.

The events are built here, from the state as it is at each step, not by the planner
(`planning.whatif`): the two share the controller's rules and nothing else, so a planner
that restarts a broker it should not is caught (tests/simulation/test_roll_check.py
plants one).

It must not have rules of its own (every decision is `step`'s), read the clock or do IO.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from controller.core.step import ControllerState, Event, Rules, StepResult, Tick, step
from controller.core.work import WORK_BUDGET
from metactl.errors import MetactlError
from metadata_image.image import ClusterImage
from metadata_image.state import TopicPartition
from metadata_log.records import NO_LEADER
from protocol.messages.broker_controller import (
    AlterPartition,
    AlterPartitions,
    BrokerHeartbeatRequest,
    IsrMember,
    RegisterBroker,
)
from protocol.messages.plan import RollStep


class Violation(msgspec.Struct, frozen=True, kw_only=True):
    """A partition left below MinISR by a core step that took a member out of its ISR,
    or left without a leader by it (or led by one it elected uncleanly)."""

    step: int  # the plan's step (0-based)
    broker_id: int  # the broker that step restarts
    event: str  # what was being stepped
    topic: str
    partition: int
    isr_before: list[int]
    isr: list[int]
    min_isr: int
    leader_before: int
    leader: int


class Missing(msgspec.Struct, frozen=True, kw_only=True):
    """A partition the plan awaits back in the broker's ISR that is not, once every
    leader has asked."""

    step: int
    broker_id: int
    topic: str
    partition: int


class RollCheck(msgspec.Struct, frozen=True, kw_only=True):
    steps: int  # the plan's steps followed
    core_steps: int  # core steps taken (slices and Ticks included)
    violations: list[Violation]
    missing: list[Missing]
    refused: list[str]

    @property
    def ok(self) -> bool:
        return not (self.violations or self.missing or self.refused)


class _Roll:
    """The state of one roll being followed, and what it found."""

    def __init__(self, image: ClusterImage, rules: Rules, now_ms: int) -> None:
        self.state = ControllerState(image)
        self.rules = rules
        self.now_ms = now_ms
        self.budget = rules.work_budget or WORK_BUDGET
        self.core_steps = 0
        self.violations: list[Violation] = []
        self.missing: list[Missing] = []
        self.refused: list[str] = []

    @property
    def image(self) -> ClusterImage:
        return self.state.image

    def drive(self, event: Event, at: tuple[int, int], what: str) -> bool:
        """`event`, its continuations and the Ticks after it, a core step at a time, each
        checked; False (and `refused` noted) if the core refuses it."""
        try:
            result = step(self.state, event, self.now_ms, self.rules)
        except MetactlError as exc:
            self.refused.append(f"step {at[0]} (broker {at[1]}): {what}: {exc.code}: {exc}")
            return False
        self._took(result, at, what)
        while result.follow_up is not None or not result.state.idle:
            follow = result.follow_up
            result = step(
                result.state, follow if follow is not None else Tick(), self.now_ms, self.rules
            )
            self._took(result, at, what)
        return True

    def _took(self, result: StepResult, at: tuple[int, int], what: str) -> None:
        before = self.image.partitions
        self.state = result.state
        self.core_steps += 1
        parts = self.image.partitions
        unclean = {(r.topic, r.partition) for r in result.delta.unclean_recoveries}
        for tp in result.delta.partitions:
            p, was = parts.get(tp), before.get(tp)
            if p is None or was is None:
                continue  # not a partition of the roll's image
            shrank = len(p.isr) < p.min_isr and not p.isr >= was.isr
            lost = was.leader != NO_LEADER and (p.leader == NO_LEADER or tp in unclean)
            if shrank or lost:
                self.violations.append(
                    Violation(
                        step=at[0], broker_id=at[1], event=what, topic=p.topic,
                        partition=p.partition, isr_before=sorted(was.isr), isr=sorted(p.isr),
                        min_isr=p.min_isr, leader_before=was.leader, leader=p.leader,
                    )
                )  # fmt: skip

    def restart(self, index: int, broker_id: int) -> bool:
        """Steps 1 and 2 of the module docstring; False if the core refused one."""
        at = (index, broker_id)
        b = self.image.broker(broker_id)
        if b is None or not b.active:
            # A roll restarts running brokers, as an operator's tool would check first.
            why = "not registered" if b is None else "not up (fenced or stopping)"
            self.refused.append(f"step {index}: broker {broker_id} is {why}")
            return False
        going = BrokerHeartbeatRequest(
            broker_id=broker_id,
            broker_epoch=b.epoch,
            metadata_offset=self.image.end_offset,
            want_shutdown=True,
        )
        if not self.drive(going, at, "controlled shutdown"):
            return False
        again = RegisterBroker(
            broker_id=broker_id,
            incarnation_id=f"roll-check-{index}-{broker_id}",
            previous_epoch=b.epoch,  # its clean-shutdown file
            endpoint=b.endpoint,
            rack=b.rack,
        )
        if not self.drive(again, at, "registration"):
            return False
        epoch = self.image.brokers[broker_id].epoch
        up = BrokerHeartbeatRequest(
            broker_id=broker_id, broker_epoch=epoch, metadata_offset=self.image.end_offset
        )
        return self.drive(up, at, "unfence")

    def rejoin(self, index: int, broker_id: int) -> None:
        """Step 3: each active leader's AlterPartitions, a work budget of items each."""
        image = self.image
        brokers = image.brokers
        items: dict[int, list[AlterPartition]] = {}
        for p in image.partitions_of(broker_id):
            leader = p.leader
            if broker_id in p.isr or leader in (NO_LEADER, broker_id):
                continue
            if not image.is_active(leader):
                continue
            isr = sorted(p.isr | {broker_id})
            items.setdefault(leader, []).append(
                AlterPartition(
                    topic=p.topic,
                    partition=p.partition,
                    leader=leader,
                    broker_epoch=brokers[leader].epoch,
                    partition_epoch=p.partition_epoch,
                    leader_epoch=p.leader_epoch,
                    isr=[IsrMember(broker_id=m, broker_epoch=brokers[m].epoch) for m in isr],
                )
            )
        for leader in sorted(items):
            batch = items[leader]
            for start in range(0, len(batch), self.budget):
                piece = AlterPartitions(items=batch[start : start + self.budget])
                self.drive(piece, (index, broker_id), f"AlterPartitions of broker {leader}")

    def awaited(self, index: int, broker_id: int, awaits: Iterable[TopicPartition]) -> None:
        """Step 4."""
        parts = self.image.partitions
        for tp in awaits:
            p = parts.get(tp)
            if p is None or broker_id not in p.isr:
                self.missing.append(
                    Missing(step=index, broker_id=broker_id, topic=tp[0], partition=tp[1])
                )


def check_roll(
    image: ClusterImage, steps: Sequence[RollStep], *, rules: Rules, now_ms: int = 0
) -> RollCheck:
    """Follow `steps` from `image` with the controller's `rules` (see the module
    docstring); what was found. A step the core refuses ends the roll there."""
    roll = _Roll(image, rules, now_ms)
    followed = 0
    for index, s in enumerate(steps):
        if not roll.restart(index, s.broker_id):
            break
        roll.rejoin(index, s.broker_id)
        roll.awaited(index, s.broker_id, ((g.topic, i) for g in s.awaits for i in g.partitions))
        followed += 1
    return RollCheck(
        steps=followed,
        core_steps=roll.core_steps,
        violations=roll.violations,
        missing=roll.missing,
        refused=roll.refused,
    )
