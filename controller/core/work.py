"""The work budget: how much one controller event may do, and where the rest waits.

Every event step is bounded by `WORK_BUDGET` partitions: the partitions it writes a
change for, creates, or evaluates for unclean recovery. Larger work continues in later
events, so that the single-threaded controller answers heartbeats and describes in
between (as Kafka's QuorumController bounds its events; see `docs/design.md`, "The work
budget"):

* An operation on one broker's partitions (fence, controlled shutdown, unfence, unclean
  registration) or a large topic creation writes its first slice in its own event and
  returns the rest as a continuation (`controller.core.handlers.Continue` or
  `CreateTopicSlice`), stepped next inside one metadata transaction (KIP-868), so that
  no reader ever sees half of it.
* Recovery evaluation is incremental: a step queues the partitions whose recovery status
  it may have changed in a `Backlog` and evaluates at most `WORK_BUDGET` of them; the
  driver steps `Tick`s while the backlog is not empty.

This module holds the two cursors that make that possible: `PartitionPlan`, a broker's
partitions in a fixed order with a position, and `Backlog`, the partitions still to be
evaluated. Both are immutable values (a step returns new ones), cost O(taken) to
advance, and never walk a million-partition index per event after the first.

Pure: no IO, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final

import msgspec

from metadata_image.image import EMPTY_INDEX, ClusterImage, ReplicaIndex, TopicPartition

WORK_BUDGET: Final = 1_000
"""Partitions per controller event: changed, created or evaluated. One slice of a
100,000-partition create takes 5-20 ms of step; a fence slice 2-5 ms (bench/
large_cluster.py), so heartbeats and describes wait for at most a few slices."""


class PartitionPlan(msgspec.Struct, frozen=True, gc=False):
    """Partitions to visit in a fixed order, from a position: a topic's partition numbers
    are held as one tuple, so taking the next `n` costs O(n) and the plan is shared (not
    copied) by every later position."""

    topics: tuple[tuple[str, tuple[int, ...]], ...] = ()
    topic_index: int = 0
    position: int = 0

    @classmethod
    def of_index(cls, index: ReplicaIndex) -> PartitionPlan:
        """Every partition of a broker's replica index, in the index's order. O(n) once,
        mostly in C (a tuple of each topic's frozenset)."""
        return cls(tuple((topic, tuple(numbers)) for topic, numbers in index.by_topic()))

    @classmethod
    def of_broker(cls, image: ClusterImage, broker_id: int) -> PartitionPlan:
        return cls.of_index(image.replicas_by_broker.get(broker_id, EMPTY_INDEX))

    @property
    def done(self) -> bool:
        return self.topic_index >= len(self.topics)

    def take(self, n: int) -> tuple[list[TopicPartition], PartitionPlan]:
        """The next `n` partitions (fewer at the end) and the plan after them."""
        groups, rest = self.take_groups(n)
        return [(topic, i) for topic, part in groups for i in part], rest

    def take_groups(self, n: int) -> tuple[list[tuple[str, tuple[int, ...]]], PartitionPlan]:
        """`take`, as (topic, partition numbers) runs: a broker's slice is read topic by
        topic (`PartitionMap.of_topic`, one chunk lookup per run), not partition by
        partition."""
        out: list[tuple[str, tuple[int, ...]]] = []
        topics, ti, pos = self.topics, self.topic_index, self.position
        while n > 0 and ti < len(topics):
            topic, numbers = topics[ti]
            part = numbers[pos : pos + n]
            out.append((topic, part))
            n -= len(part)
            pos += len(part)
            if pos >= len(numbers):
                ti, pos = ti + 1, 0
        return out, PartitionPlan(topics, ti, pos)


class Backlog(msgspec.Struct, frozen=True, gc=False):
    """Partitions whose unclean-recovery status may have changed and that are still to be
    evaluated: a few plans (a broker's partitions, after its state changed) and small
    tuples of named partitions, consumed front to back. A partition may be queued twice;
    evaluating it twice is harmless (evaluation is idempotent for an unchanged input).

    `everything` asks for a look at every leaderless partition (a fresh controller, or one
    that reverted to its committed image): the first step turns it into a plan of the
    image's offline partitions."""

    parts: tuple[PartitionPlan, ...] = ()
    everything: bool = False

    @property
    def empty(self) -> bool:
        return not self.everything and not self.parts

    def with_partitions(self, tps: Iterable[TopicPartition]) -> Backlog:
        grouped: dict[str, list[int]] = {}
        for topic, i in tps:
            grouped.setdefault(topic, []).append(i)
        if not grouped:
            return self
        plan = PartitionPlan(tuple((t, tuple(n)) for t, n in grouped.items()))
        return Backlog((*self.parts, plan), self.everything)

    def first(self, tps: Iterable[TopicPartition]) -> Backlog:
        """This backlog with `tps` in front of it."""
        head = Backlog().with_partitions(tps)
        return Backlog((*head.parts, *self.parts), self.everything)

    def with_plan(self, plan: PartitionPlan) -> Backlog:
        return Backlog((*self.parts, plan), self.everything)

    def resolve(self, image: ClusterImage, *noted: Iterable[TopicPartition]) -> Backlog:
        """`everything` made concrete: every leaderless partition of `image`, and the
        partitions of `noted` (the tracker's notes and pending recoveries, which a look
        drops if they are led again)."""
        if not self.everything:
            return self
        every = dict.fromkeys(image.offline)
        for tps in noted:
            every.update(dict.fromkeys(tps))
        return Backlog(self.parts).with_partitions(every)

    def take(self, n: int | None) -> tuple[list[TopicPartition], Backlog]:
        """Up to `n` queued partitions (None: all of them) and the backlog after them.
        Call `resolve` first."""
        assert not self.everything
        out: list[TopicPartition] = []
        parts = list(self.parts)
        while parts and (n is None or len(out) < n):
            want = n - len(out) if n is not None else 1 << 62
            got, rest = parts[0].take(want)
            out.extend(got)
            if rest.done:
                parts.pop(0)
            else:
                parts[0] = rest
        return out, Backlog(tuple(parts))

    def __iter__(self) -> Iterator[TopicPartition]:  # for tests and tools: what is queued
        for plan in self.parts:
            rest = plan
            while not rest.done:
                got, rest = rest.take(1 << 16)
                yield from got


EMPTY_BACKLOG: Final = Backlog()
EVERYTHING: Final = Backlog(everything=True)
