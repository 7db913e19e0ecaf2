"""The model-based test of `test_properties.py` under Kafka's classic rules.

`ClassicMachine` runs the same state machine with `eligible_leader_replicas=False`, and
`ClassicUncleanMachine` adds `unclean_leader_election=True`. The model restates the
classic rules itself (`Model(classic=True, unclean=...)`: no ELR or LastKnownELR, the last
ISR member stays in the ISR, clean election from active ISR members only, unfence elects
where the broker is in the ISR, and the classic unclean election at once, without log
inspection), so every rule's expectation, error code and recovery record is still the
model's. The KIP-966 invariants that do not hold here by design (Unclean Exclusion, no
inactive broker in any ISR) give way to the classic invariants below.

The lifecycle runs here too (issue 19). Upgrading eligible.leader.replicas.version to 1
switches `ClassicMachine` to KIP-966's rules (the model follows, and the KIP-966
invariants apply while it lasts); `ClassicUncleanMachine` refuses the upgrade (unclean
leader election is a classic-mode setting). A replica a reassignment is adding is never
chosen by the classic unclean election.
"""

from __future__ import annotations

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from controller.core.config import ControllerConfig
from metadata_log.records import NO_LEADER, UncleanRecoveryRecord

from .test_properties import (
    CLASSIC_UNCLEAN_ELECTION,
    CONFIG,
    CONTROLLER,
    ControllerMachine,
)

# Fewer examples than the KIP-966 machine's (the same steps per example): the classic
# rules have fewer paths, and the suite should stay quick.
CLASSIC_SETTINGS = settings(CONTROLLER, max_examples=max(1, CONTROLLER.max_examples // 3))


class ClassicMachine(ControllerMachine):
    CONFIG = ControllerConfig(
        unclean_recovery_window_ms=CONFIG.unclean_recovery_window_ms,
        unclean_recovery_strategy=CONFIG.unclean_recovery_strategy,
        eligible_leader_replicas=False,
    )

    def __init__(self) -> None:
        super().__init__()
        self.audited = 0  # how much of the log `recovery_records_are_classic` has read

    def electable(self) -> list[tuple[int, int]]:
        """(partition index, replica) pairs an operator's unclean election can take: a
        leaderless partition and one of its active replicas."""
        m = self.model
        parts = sorted(m.parts)
        return [
            (i, r)
            for i, tp in enumerate(parts)
            if m.parts[tp].leader == NO_LEADER
            for r in m.parts[tp].replicas
            if m.active(r)
        ]

    @precondition(lambda self: self.electable())
    @rule(j=st.integers(0, 100))
    def elect_unclean_where_it_can(self, j: int) -> None:
        """`elect_unclean` aimed where it succeeds: with the classic rules a leaderless
        partition with an active replica is rare (the ISR keeps its last member, and
        random aim seldom finds it). The model computes the outcome as for any election;
        with unclean leader election such a partition never exists."""
        i, replica = self.electable()[j % len(self.electable())]
        self.elect_unclean(i, replica)

    @invariant()
    def classic_partition_invariants(self) -> None:
        """While the classic rules apply (the ELR feature may be upgraded, and then
        downgraded again), for the partitions whose state they made: a partition that was
        under KIP-966's rules keeps what those rules did (`Model.legacy`)."""
        image = self.image
        if not self.model.classic:
            return
        for tp, p in image.partitions.items():
            if tp in self.model.legacy:
                continue
            # No ELR, no LastKnownELR, ever; and the ISR never empties (every partition
            # starts with a live ISR member).
            assert not p.elr and not p.last_known_elr, tp
            assert p.isr, tp
            # An inactive ISR member is the last one, kept, and the partition is
            # leaderless; a leaderless partition has no active ISR member.
            inactive = {r for r in p.isr if not image.is_active(r)}
            if inactive:
                assert p.isr == inactive and len(inactive) == 1, (tp, p.isr)
                assert p.leader == NO_LEADER, tp
            if p.leader == NO_LEADER:
                assert inactive, (tp, p.isr)
            # The classic loss: a replica that registered uncleanly stays in the ISR only
            # as the last member it was (and may be elected from there, silently).
            tainted = self.model.tainted[tp] & p.isr
            if tainted:
                assert p.isr == tainted, (tp, p.isr, tainted)
                if p.leader in tainted and not p.recovery_state.value:
                    event("classic: an uncleanly restarted last ISR member leads again")
            if self.model.unclean and p.leader == NO_LEADER:
                # The unclean election leaves a partition leaderless only while no
                # replica is active but those a reassignment is adding (which hold none of
                # the acknowledged records, and are never elected).
                assert not any(image.is_active(r) for r in p.original), tp

    @invariant()
    def recovery_records_are_classic(self) -> None:
        """Plain classic: only an operator's election writes an UncleanRecoveryRecord.
        With unclean election: the classic election does, and an operator's only of a
        replica a reassignment is adding (needing a leaderless partition with an active
        replica, which the classic election elects unless the reassignment is adding it)."""
        for r in self.log[self.audited :]:
            if not isinstance(r, UncleanRecoveryRecord) or not self.model.classic:
                continue
            if self.model.unclean and r.strategy != "manual":
                assert (r.strategy, r.trigger, r.candidates) == (
                    CLASSIC_UNCLEAN_ELECTION,
                    "no_live_isr_member",
                    [],
                ), r
                event("classic: unclean leader election")
            else:
                assert (r.strategy, r.trigger) == ("manual", "operator"), r
                if self.model.unclean:
                    p = self.model.parts.get((r.topic, r.partition))
                    assert p is None or r.chosen not in p.original, r
        self.audited = len(self.log)


class ClassicUncleanMachine(ClassicMachine):
    CONFIG = ControllerConfig(
        unclean_recovery_window_ms=CONFIG.unclean_recovery_window_ms,
        unclean_recovery_strategy=CONFIG.unclean_recovery_strategy,
        eligible_leader_replicas=False,
        unclean_leader_election=True,
    )


ClassicMachine.TestCase.settings = CLASSIC_SETTINGS
TestClassicController = ClassicMachine.TestCase

ClassicUncleanMachine.TestCase.settings = CLASSIC_SETTINGS
TestClassicUncleanController = ClassicUncleanMachine.TestCase
