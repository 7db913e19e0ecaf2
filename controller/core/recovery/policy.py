"""The unclean-recovery policy protocol and the shared candidate order.

A policy is a small stateless object that answers three questions about one leaderless
partition:

* `trigger(image, p)`: should recovery start (and why)? None means "not my business".
* `candidates(image, p)`: whose logs should be inspected?
* `decide(image, p, pending, now_ms)`: with the answers so far, choose a replica, keep
  waiting (optionally until a deadline), or restart the window.

Policies are pure: no IO, no clock reads (time is passed in), no state of their own; the
tracker keeps the pending recoveries. Evaluation is incremental (a partition is looked at
again when it changes, a broker hosting it changes state, an answer arrives, or its
window's end or `Wait.until_ms` comes), so a decision may depend only on the partition,
its replicas' brokers, the answers and the time. Register a custom one under the entry-point
group ``metactl.recovery_policies``, exactly as the built-ins are.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar, Protocol

import immutables
import msgspec

from metadata_image.image import ClusterImage
from metadata_image.state import PartitionState
from metadata_log.records import RecoveryCandidate


class PendingRecovery(msgspec.Struct, frozen=True, kw_only=True):
    """Soft state of one recovery in progress (never logged; restarts with the controller)."""

    topic: str
    partition: int
    strategy: str
    trigger: str
    since_ms: int  # when the partition lost its last leader (the record's offline_since_ms)
    started_ms: int  # start of the current window
    deadline_ms: int | None = None  # end of the current window, for windowed policies
    answers: immutables.Map[int, RecoveryCandidate] = immutables.Map()
    requested: immutables.Map[int, int] = immutables.Map()  # broker -> epoch asked at

    def valid_answers(self, image: ClusterImage) -> list[RecoveryCandidate]:
        """Answers given by the broker's current incarnation (a re-registration voids them)."""
        out = []
        for bid, a in self.answers.items():
            b = image.broker(bid)
            if b is not None and b.epoch == a.broker_epoch:
                out.append(a)
        return out


class Wait(msgspec.Struct, frozen=True):
    until_ms: int | None = None


class Choose(msgspec.Struct, frozen=True):
    broker_id: int


class RestartWindow(msgspec.Struct, frozen=True):
    pass


Decision = Wait | Choose | RestartWindow


class RecoveryPolicy(Protocol):
    name: ClassVar[str]

    def trigger(self, image: ClusterImage, p: PartitionState) -> str | None: ...

    def candidates(self, image: ClusterImage, p: PartitionState) -> frozenset[int]: ...

    def window_ms(self, window_ms: int) -> int | None:
        """The length of a decision window, or None for policies that do not use one."""
        ...

    def decide(
        self, image: ClusterImage, p: PartitionState, pending: PendingRecovery, now_ms: int
    ) -> Decision: ...


def best_candidate(
    p: PartitionState, answers: Iterable[RecoveryCandidate]
) -> RecoveryCandidate | None:
    """Highest (last leader epoch, log end offset); ties go to the earlier assigned replica."""
    order = {r: i for i, r in enumerate(p.replicas)}
    best: RecoveryCandidate | None = None
    best_key: tuple[int, int, int] | None = None
    for a in answers:
        key = (a.last_leader_epoch, a.log_end_offset, -order.get(a.broker_id, len(order)))
        if best_key is None or key > best_key:
            best, best_key = a, key
    return best
