"""The work budget: how much one controller event may do, and where the rest waits.

Every event step is bounded by `WORK_BUDGET` partitions: the partitions it writes a
change for, creates, or evaluates for unclean recovery. Larger work continues in later
events, so that the single-threaded controller answers heartbeats and describes in
between (as Kafka's QuorumController bounds its events; see `docs/design.md`, "The work
budget"):

* An operation on one broker's partitions (fence, controlled shutdown, unfence, unclean
  registration) or a large topic creation writes its first slice in its own event and
  returns the rest as a continuation (`controller.core.handler_result.Continue`
  or `CreateTopicSlice`), stepped next inside one metadata transaction (KIP-868), so that
  no reader ever sees half of it.
* Recovery evaluation is incremental: a step queues the partitions whose recovery status
  it may have changed in a `Backlog` and evaluates at most `WORK_BUDGET` of them; the
  driver steps `Tick`s while the backlog is not empty. After a start or a revert (every
  leaderless partition to look at, `EVERYTHING`) a large image is not listed in one
  step either: a `Sweep` walks its partitions, a bounded stretch per step, and hands out
  the leaderless ones it meets.

This module holds the cursors that make that possible: `PartitionPlan`, a broker's
partitions in a fixed order with a position, `Sweep`, every partition of an image in
(topic name, partition) order with a position, and `Backlog`, the partitions still to be
evaluated. All are immutable values (a step returns new ones), cost O(taken) to
advance (a sweep O(`SWEEP_SCAN` x taken) membership checks at most), and never walk a
million-partition index per event.

Pure: no IO, no clock.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator
from typing import Final

import msgspec

from metadata_image.image import EMPTY_INDEX, ClusterImage, ReplicaIndex
from metadata_image.state import TopicPartition

WORK_BUDGET: Final = 1_000
"""Partitions per controller event: changed, created or evaluated. One slice of a
100,000-partition create takes 5-20 ms of step; a fence slice 2-5 ms (bench/
large_cluster.py), so heartbeats and describes wait for at most a few slices."""

SWEEP_SCAN: Final = 16
"""A sweep looks at most this many partitions per partition it may hand out: a step takes
at most `SWEEP_SCAN` x budget membership checks (16,000, about 2-4 ms) from a sweep."""

MATERIALIZE_BELOW: Final = 4 * WORK_BUDGET
"""`Backlog.resolve` lists the leaderless partitions outright while there are at most this
many (O(4,000)); beyond, it sweeps the image instead."""


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


class Sweep(msgspec.Struct, frozen=True, gc=False):
    """Every partition of an image, in (topic name, partition) order, from a position:
    what `Backlog.resolve` queues instead of listing a million leaderless partitions in
    one step. Holds each topic's name and partition count only (O(topics) to make), so
    taking from it costs what it looks at, never the whole image."""

    topics: tuple[tuple[str, int], ...] = ()
    topic_index: int = 0
    position: int = 0

    @classmethod
    def of_image(cls, image: ClusterImage) -> Sweep:
        return cls(tuple((name, image.topics[name].partitions) for name in sorted(image.topics)))

    @property
    def done(self) -> bool:
        return self.topic_index >= len(self.topics)

    def take(
        self, n: int | None, keep: Container[TopicPartition] | None = None
    ) -> tuple[list[TopicPartition], Sweep]:
        """Up to `n` partitions (None: all) and the sweep after them. With `keep`, only
        the partitions in it are handed out, and at most `SWEEP_SCAN` x `n` are looked
        at: fewer (even none) may come back before the sweep is done."""
        out: list[TopicPartition] = []
        topics, ti, pos = self.topics, self.topic_index, self.position
        scan = None if n is None else (n if keep is None else SWEEP_SCAN * n)
        while ti < len(topics) and (n is None or (len(out) < n and scan)):
            name, count = topics[ti]
            end = count if scan is None else min(count, pos + scan)
            if keep is None:
                if n is not None:
                    end = min(end, pos + n - len(out))
                out.extend((name, i) for i in range(pos, end))
                looked = end - pos
            else:
                looked = 0
                for i in range(pos, end):
                    looked += 1
                    tp = (name, i)
                    if tp in keep:
                        out.append(tp)
                        if n is not None and len(out) >= n:
                            break
            pos += looked
            if scan is not None:
                scan -= looked
            if pos >= count:
                ti, pos = ti + 1, 0
        return out, Sweep(topics, ti, pos)


class Backlog(msgspec.Struct, frozen=True, gc=False):
    """Partitions whose unclean-recovery status may have changed and that are still to be
    evaluated: a few plans (a broker's partitions, after its state changed) and small
    tuples of named partitions, consumed front to back. A partition may be queued twice;
    evaluating it twice is harmless (evaluation is idempotent for an unchanged input).

    `everything` asks for a look at every leaderless partition (a fresh controller, or one
    that reverted to its committed image): the first step resolves it, into a list of
    the image's leaderless partitions when they are few (`MATERIALIZE_BELOW`), else into
    a `Sweep` of the image, taken after the parts, that hands out only the partitions
    leaderless when it meets them (a partition that loses its leader later is queued by
    the step that changed it)."""

    parts: tuple[PartitionPlan, ...] = ()
    everything: bool = False
    sweep: Sweep | None = None

    @property
    def empty(self) -> bool:
        return not self.everything and not self.parts and self.sweep is None

    def with_partitions(self, tps: Iterable[TopicPartition]) -> Backlog:
        grouped: dict[str, list[int]] = {}
        for topic, i in tps:
            grouped.setdefault(topic, []).append(i)
        if not grouped:
            return self
        plan = PartitionPlan(tuple((t, tuple(n)) for t, n in grouped.items()))
        return self.with_plan(plan)

    def first(self, tps: Iterable[TopicPartition]) -> Backlog:
        """This backlog with `tps` in front of it."""
        head = Backlog().with_partitions(tps)
        return msgspec.structs.replace(self, parts=(*head.parts, *self.parts))

    def with_plan(self, plan: PartitionPlan) -> Backlog:
        return msgspec.structs.replace(self, parts=(*self.parts, plan))

    def then(self, other: Backlog) -> Backlog:
        """This backlog, then `other`'s parts; `other`'s sweep (a newer look at everything)
        replaces this one's."""
        return Backlog(
            (*self.parts, *other.parts),
            self.everything or other.everything,
            other.sweep if other.sweep is not None else self.sweep,
        )

    def resolve(self, image: ClusterImage, *noted: Iterable[TopicPartition]) -> Backlog:
        """`everything` made concrete: every leaderless partition of `image`, and the
        partitions of `noted` (the tracker's notes and pending recoveries, which a look
        drops if they are led again). Few leaderless partitions are listed; more are left
        to a `Sweep` of the image (O(topics) now, then a bounded stretch per step), and
        only the noted ones that are led are listed (none after a start: the tracker is
        empty)."""
        if not self.everything:
            return self
        offline = image.offline
        rest = Backlog(self.parts, sweep=self.sweep)
        if len(offline) <= MATERIALIZE_BELOW:
            every = dict.fromkeys(offline)
            for tps in noted:
                every.update(dict.fromkeys(tps))
            return rest.with_partitions(every)
        led = dict.fromkeys(tp for tps in noted for tp in tps if tp not in offline)
        return msgspec.structs.replace(rest.with_partitions(led), sweep=Sweep.of_image(image))

    def take(
        self, n: int | None, offline: Container[TopicPartition] | None = None
    ) -> tuple[list[TopicPartition], Backlog]:
        """Up to `n` queued partitions (None: all of them) and the backlog after them: the
        parts first, then the sweep's partitions that are in `offline` (None: all of
        them). Call `resolve` first."""
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
        sweep = self.sweep
        if sweep is not None and (n is None or len(out) < n):
            got, sweep = sweep.take(None if n is None else n - len(out), offline)
            out.extend(got)
            if sweep.done:
                sweep = None
        return out, Backlog(tuple(parts), sweep=sweep)

    def __iter__(self) -> Iterator[TopicPartition]:  # for tests and tools: what is queued
        for plan in self.parts:
            rest = plan
            while not rest.done:
                got, rest = rest.take(1 << 16)
                yield from got
        if self.sweep is not None:
            yield from self.sweep.take(None)[0]


EMPTY_BACKLOG: Final = Backlog()
EVERYTHING: Final = Backlog(everything=True)
