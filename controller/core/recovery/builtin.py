"""The built-in unclean-recovery policies: balanced (default), proactive and manual.

They follow section 5.3 of the recovery document, not Kafka, which never shipped
unclean recovery (its only fallback is `unclean.leader.election.enable`).
"""

from __future__ import annotations

from typing import ClassVar

from controller.core.recovery.policy import (
    Choose,
    Decision,
    PendingRecovery,
    RestartWindow,
    Wait,
    best_candidate,
)
from metadata_image.image import ClusterImage
from metadata_image.state import EMPTY, PartitionState


class BalancedPolicy:
    """Acts only when ISR and ELR are both empty, and waits for every LastKnownELR member.

    With MinISR Recovery Quorum the LastKnownELR holds at least MinISR replicas, so if
    any of them is complete it is chosen. An empty LastKnownELR cannot be recovered
    automatically: the partition stays pending until an operator elects.
    """

    name: ClassVar[str] = "balanced"

    def trigger(self, image: ClusterImage, p: PartitionState) -> str | None:
        if p.has_leader or p.isr or p.elr:
            return None
        return "isr_and_elr_empty"

    def candidates(self, image: ClusterImage, p: PartitionState) -> frozenset[int]:
        return p.last_known_elr

    def window_ms(self, window_ms: int) -> int | None:
        return None

    def decide(
        self, image: ClusterImage, p: PartitionState, pending: PendingRecovery, now_ms: int
    ) -> Decision:
        members = p.last_known_elr
        answers = [a for a in pending.valid_answers(image) if a.broker_id in members]
        if not members or {a.broker_id for a in answers} != members:
            return Wait()
        best = best_candidate(p, answers)
        if best is None or not image.is_active(best.broker_id):
            return Wait()
        return Choose(best.broker_id)


class ProactivePolicy:
    """Acts as soon as no clean candidate is active, after a short window of inspection.

    At the window's end it takes the best answer from replicas that are active then; a
    clean election during the window (an ELR member unfencing) cancels the recovery.
    """

    name: ClassVar[str] = "proactive"

    def trigger(self, image: ClusterImage, p: PartitionState) -> str | None:
        if p.has_leader or p.isr:
            return None
        if any(image.is_active(r) for r in p.elr):
            return None
        return "elr_all_fenced" if p.elr else "isr_and_elr_empty"

    def candidates(self, image: ClusterImage, p: PartitionState) -> frozenset[int]:
        # A replica a reassignment is adding never held the partition's acknowledged
        # data as an ISR member: it is not a candidate (docs/lifecycle.md).
        return frozenset(p.replicas).difference(p.adding)

    def window_ms(self, window_ms: int) -> int | None:
        return window_ms

    def decide(
        self, image: ClusterImage, p: PartitionState, pending: PendingRecovery, now_ms: int
    ) -> Decision:
        if pending.deadline_ms is not None and now_ms < pending.deadline_ms:
            return Wait(pending.deadline_ms)
        answers = [
            a
            for a in pending.valid_answers(image)
            if a.broker_id in p.replicas
            and a.broker_id not in p.adding
            and image.is_active(a.broker_id)
        ]
        best = best_candidate(p, answers)
        if best is None:
            return RestartWindow()
        return Choose(best.broker_id)


class ManualPolicy:
    """Never acts: an operator's unclean election does."""

    name: ClassVar[str] = "manual"

    def trigger(self, image: ClusterImage, p: PartitionState) -> str | None:
        return None

    def candidates(self, image: ClusterImage, p: PartitionState) -> frozenset[int]:
        return EMPTY

    def window_ms(self, window_ms: int) -> int | None:
        return None

    def decide(
        self, image: ClusterImage, p: PartitionState, pending: PendingRecovery, now_ms: int
    ) -> Decision:
        return Wait()


class ClassicUncleanElection:
    """Kafka's `unclean.leader.election.enable`, under the classic rules only.

    Not a selectable strategy: the controller uses it in place of every topic's strategy
    when it runs with `--eligible-leader-replicas disabled --unclean-leader-election`.
    When no ISR member is active, the first active replica in assignment order is elected
    at once, with no log inspection. It is written as an unclean recovery (strategy
    `unclean_leader_election`), because each one is a potential data-loss event.
    """

    name: ClassVar[str] = "unclean_leader_election"

    def trigger(self, image: ClusterImage, p: PartitionState) -> str | None:
        if p.has_leader or any(image.is_active(r) for r in p.isr):
            return None
        return "no_live_isr_member"

    def candidates(self, image: ClusterImage, p: PartitionState) -> frozenset[int]:
        return EMPTY  # nobody is asked for their log

    def window_ms(self, window_ms: int) -> int | None:
        return None

    def decide(
        self, image: ClusterImage, p: PartitionState, pending: PendingRecovery, now_ms: int
    ) -> Decision:
        for r in p.replicas:
            if image.is_active(r) and r not in p.adding:
                return Choose(r)
        return Wait()


CLASSIC_UNCLEAN = ClassicUncleanElection()
