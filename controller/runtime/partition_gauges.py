"""The per-partition sets behind the controller's gauges, kept from committed deltas so
that a scrape reads a few set sizes and one number, never walks the partitions.

`PartitionHealth`: the partitions under MinISR, with an ELR, with a LastKnownELR, and
recovering. `Reassignments`: the partitions being reassigned, with when each started
(the oldest's age is one read) and what it started from (a cancel restores it), so that
`update` says what happened to a changed partition: started, completed or cancelled.
`controller.runtime.metrics` updates both on each commit and reads them at scrape time.

Must not: decide anything, touch the log, or read a clock (time comes in as `now_ms`).
"""

from __future__ import annotations

from collections import deque

from metadata_image.image import ClusterImage
from metadata_image.state import PartitionState, TopicPartition
from metadata_log.records import LeaderRecoveryState

__all__ = ["PartitionHealth", "Reassignments"]


class PartitionHealth:
    """The partitions in each state worth a gauge, updated per changed partition.

    A scrape then reads four set sizes instead of walking every partition. `rebuild`
    walks the whole image once (at attach); `update` re-reads one partition.
    """

    __slots__ = ("last_known_elr", "recovering", "under_min_isr", "with_elr")

    def __init__(self) -> None:
        self.under_min_isr: set[TopicPartition] = set()
        self.with_elr: set[TopicPartition] = set()
        self.last_known_elr: set[TopicPartition] = set()
        self.recovering: set[TopicPartition] = set()

    def rebuild(self, image: ClusterImage) -> None:
        for s in (self.under_min_isr, self.with_elr, self.last_known_elr, self.recovering):
            s.clear()
        for p in image.partitions.values():
            self.update(p.tp, p)

    def update(self, tp: TopicPartition, p: PartitionState | None) -> None:
        """Re-read one partition's state (None: it does not exist)."""
        if p is None:
            self.set(tp, under_min_isr=False, elr=False, last_known_elr=False, recovering=False)
        else:
            self.set(
                tp,
                under_min_isr=len(p.isr) < p.min_isr,
                elr=bool(p.elr),
                last_known_elr=bool(p.last_known_elr),
                recovering=p.recovery_state is LeaderRecoveryState.RECOVERING,
            )

    def set(
        self,
        tp: TopicPartition,
        *,
        under_min_isr: bool,
        elr: bool,
        last_known_elr: bool,
        recovering: bool,
    ) -> None:
        # Unrolled: this runs once per partition record of a bulk change.
        if under_min_isr:
            self.under_min_isr.add(tp)
        else:
            self.under_min_isr.discard(tp)
        if elr:
            self.with_elr.add(tp)
        else:
            self.with_elr.discard(tp)
        if last_known_elr:
            self.last_known_elr.add(tp)
        else:
            self.last_known_elr.discard(tp)
        if recovering:
            self.recovering.add(tp)
        else:
            self.recovering.discard(tp)

    def drop_topic(self, topic: str, partitions: int) -> None:
        """Forget a deleted topic's partitions (the delta of a RemoveTopicRecord no longer
        names them): O(min(partitions, set size)) per set."""
        for s in (self.under_min_isr, self.with_elr, self.last_known_elr, self.recovering):
            _drop_topic(s, topic, partitions)

    @staticmethod
    def scan(image: ClusterImage) -> dict[str, int]:
        """The same counts by a full walk (for tests that check the incremental sets)."""
        h = PartitionHealth()
        h.rebuild(image)
        return h.counts()

    def counts(self) -> dict[str, int]:
        return {
            "under_min_isr": len(self.under_min_isr),
            "with_elr": len(self.with_elr),
            "last_known_elr": len(self.last_known_elr),
            "recovering": len(self.recovering),
        }


def _drop_topic(s: set[TopicPartition], topic: str, partitions: int) -> None:
    if len(s) <= partitions:
        gone = [tp for tp in s if tp[0] == topic]
        s.difference_update(gone)
    else:
        for i in range(partitions):
            s.discard((topic, i))


class Reassignments:
    """The partitions being reassigned, each with when its reassignment was first seen
    committed and its replicas before it (what a cancel restores), in the order they
    started: the oldest is the first entry, so its age is one read at scrape time.

    `update` re-reads one changed partition and says what happened to it (started,
    completed, cancelled, or None). Partitions already reassigning when the metrics attach
    (a restart, a failover) count from then: their age is at least that old.
    """

    __slots__ = ("_order", "moving", "oldest_since_ms")

    def __init__(self) -> None:
        self.moving: dict[TopicPartition, tuple[int, tuple[int, ...]]] = {}
        # (start, tp) in start order; entries whose partition is no longer moving (or
        # moves again since a later start) are dropped lazily from the left, so finding
        # the oldest costs O(1) amortized however the moves end.
        self._order: deque[tuple[int, TopicPartition]] = deque()
        self.oldest_since_ms: int | None = None

    def rebuild(self, image: ClusterImage, now_ms: int) -> None:
        self.moving.clear()
        self._order.clear()
        partitions = image.partitions
        for tp in image.reassigning:
            p = partitions.get(tp)
            if p is not None:
                self.moving[tp] = (now_ms, p.original)
                self._order.append((now_ms, tp))
        self._oldest()

    def update(self, tp: TopicPartition, p: PartitionState | None, now_ms: int) -> str | None:
        """Re-read one partition (None: it does not exist). Cheap when nothing moves."""
        moving = self.moving
        if p is not None and (p.adding or p.removing):
            if tp in moving:
                return None
            moving[tp] = (now_ms, p.original)
            self._order.append((now_ms, tp))
            if self.oldest_since_ms is None:
                self.oldest_since_ms = now_ms
            return "started"
        if not moving:
            return None
        was = moving.pop(tp, None)
        if was is None:
            return None
        self._oldest()
        if p is None:
            return None  # deleted: neither completed nor cancelled
        return "cancelled" if set(p.replicas) == set(was[1]) else "completed"

    def drop_topic(self, topic: str) -> None:
        gone = [tp for tp in self.moving if tp[0] == topic]
        for tp in gone:
            del self.moving[tp]
        if gone:
            self._oldest()

    def _oldest(self) -> None:
        order, moving = self._order, self.moving
        while order:
            since, tp = order[0]
            now = moving.get(tp)
            if now is not None and now[0] == since:
                self.oldest_since_ms = since
                return
            order.popleft()
        self.oldest_since_ms = None

    def age_seconds(self, now_ms: int) -> float:
        since = self.oldest_since_ms  # one read: the scrape thread's view of it
        return 0.0 if since is None else max(0.0, (now_ms - since) / 1000)
