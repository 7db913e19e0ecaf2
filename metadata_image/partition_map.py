"""The image's partitions: a persistent map from (topic, partition) to `PartitionState`.

Owns the storage of the image's partitions and its copy-on-write mutation, which replay
uses to build the next image. Must not know any rule, hold anything but partition
states, or change a map that has been handed out.

Why not one HAMT keyed by (topic, partition) (`immutables.Map`, which the image used
before): a fence at 100,000 partitions changes 10,000 of them, and 10,000 HAMT inserts
copied and re-linked nodes at about 0.8 µs each (7.5 ms of a 32 ms step, measured with
`bench/controller_ops.py`'s cluster), and every key was a tuple object kept alive for the
life of the image. Partition numbers are dense within a topic, so here partitions sit in
chunks of `CHUNK` consecutive numbers of one topic: one HAMT maps (topic, chunk number)
to a list of states, with `None` in the holes. Changing a partition copies its chunk
(at most 256 pointers) once per mutation, and finishing the mutation inserts each
changed chunk once: copying every chunk of a 100,000-partition image this way costs
about 0.4 ms, where the fence's 10,000 inserts cost 7.5. A topic of a few partitions is
one chunk, one HAMT entry, as it was one entry per partition before.

Chunks are stored canonically (no trailing `None`, no empty chunk), so two maps with the
same content compare equal by comparing their chunks. Iteration visits chunks in the
HAMT's order and partitions in chunk order; like the HAMT before it, it is not sorted,
and callers that need an order sort.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence, ValuesView
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import immutables

from metadata_image.state import PartitionState, TopicPartition

CHUNK_BITS: Final = 8
CHUNK: Final = 1 << CHUNK_BITS
CHUNK_MASK: Final = CHUNK - 1

# A chunk is a list that no one changes once a `finish()` stored it: a mutation edits its
# own copy (`PartitionMapMutation.chunk`). Stored as the list, not copied again into a
# tuple: that second copy touched every partition of each chunk a fence edits, about a
# tenth of a 10,000-partition fence's replay.
Chunk: TypeAlias = "Sequence[PartitionState | None]"
ChunkKey: TypeAlias = tuple[str, int]  # (topic, partition >> CHUNK_BITS)

_MISSING: Any = object()


def _at(chunk: Any, i: int, default: Any) -> Any:
    """Partition `i`'s entry in its chunk (a tuple, a list or None), else `default`."""
    if chunk is not None:
        j = i & CHUNK_MASK
        if j < len(chunk):
            value = chunk[j]
            if value is not None:
                return value
    return default


class _Reads:
    """Item access and membership, for the map and its mutation, on top of `get`."""

    __slots__ = ()

    if TYPE_CHECKING:

        def get(self, key: Any, default: Any = None) -> Any: ...

    def __getitem__(self, key: TopicPartition) -> PartitionState:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value  # type: ignore[no-any-return]

    def __contains__(self, key: object) -> bool:
        return self.get(key, _MISSING) is not _MISSING


class PartitionMap(_Reads, Mapping[TopicPartition, PartitionState]):
    """An immutable map (topic, partition) -> PartitionState; `mutate()` edits a copy."""

    __slots__ = ("_chunks", "_len")

    _chunks: immutables.Map[ChunkKey, Chunk]
    _len: int

    def __init__(self) -> None:
        """The empty map (`EMPTY_PARTITIONS`); others come from `mutate()`."""
        self._chunks = immutables.Map()
        self._len = 0

    @classmethod
    def _of(cls, chunks: immutables.Map[ChunkKey, Chunk], size: int) -> PartitionMap:
        out = cls.__new__(cls)
        out._chunks = chunks
        out._len = size
        return out

    # --- reading ------------------------------------------------------------------------

    def get(self, key: Any, default: Any = None) -> Any:
        try:
            topic, i = key
            chunk = self._chunks.get((topic, i >> CHUNK_BITS))
        except (TypeError, ValueError):
            return default
        return _at(chunk, i, default)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[TopicPartition]:
        for value in self._values():
            yield value.tp

    def values(self) -> ValuesView[PartitionState]:
        return _Values(self)  # walks the chunks, where Mapping's would look up every key

    def _values(self) -> Iterator[PartitionState]:
        for chunk in self._chunks.values():
            for value in chunk:
                if value is not None:
                    yield value

    def chunk_at(self, topic: str, c: int) -> Chunk:
        """Chunk `c` of `topic` (partitions `c * CHUNK` on, `None` in its holes; empty if
        it holds none), to read entry `i & CHUNK_MASK` of partition `i`: for a loop over
        many partitions that does its own work per partition (a fence's decisions), where
        `of_topic`'s generator cost as much as the work."""
        return self._chunks.get((topic, c), ())

    def of_topic(self, topic: str, numbers: Iterable[int]) -> Iterator[PartitionState]:
        """The partitions `numbers` of `topic`, in that order; KeyError for one missing.

        `ClusterImage.partitions_of` walks a broker's replicas with this: one chunk
        lookup per run of numbers in the same chunk rather than one per partition."""
        chunks = self._chunks
        last_c = None
        chunk: Chunk = ()
        for i in numbers:
            c = i >> CHUNK_BITS
            if c != last_c:
                chunk = chunks.get((topic, c), ())
                last_c = c
            j = i & CHUNK_MASK  # `_at`, inlined: this loop reads a broker's partitions
            value = chunk[j] if j < len(chunk) else None
            if value is None:
                raise KeyError((topic, i))
            yield value

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PartitionMap):
            return self._len == other._len and self._chunks == other._chunks
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PartitionMap(<{self._len} partitions in {len(self._chunks)} chunks>)"

    # --- new maps -----------------------------------------------------------------------

    def mutate(self) -> PartitionMapMutation:
        return PartitionMapMutation(self)

    def delete(self, key: TopicPartition) -> PartitionMap:
        m = self.mutate()
        del m[key]
        return m.finish()


class _Values(ValuesView[PartitionState]):
    _mapping: PartitionMap

    def __iter__(self) -> Iterator[PartitionState]:
        return self._mapping._values()


class PartitionMapMutation(_Reads):
    """A working copy of a `PartitionMap`: read, set and delete, then `finish()`.

    `_work` holds the chunks edited so far, each as this mutation's own list."""

    __slots__ = ("_base", "_chunks", "_len", "_work")

    def __init__(self, base: PartitionMap) -> None:
        self._base = base
        self._chunks = base._chunks
        self._len = base._len
        self._work: dict[ChunkKey, list[PartitionState | None]] = {}

    def get(self, key: TopicPartition, default: Any = None) -> Any:
        topic, i = key
        c = (topic, i >> CHUNK_BITS)
        chunk: Any = self._work.get(c)
        return _at(self._chunks.get(c) if chunk is None else chunk, i, default)

    def __len__(self) -> int:
        return self._len

    def chunk(self, topic: str, c: int) -> list[PartitionState | None] | None:
        """Chunk `c` of `topic` (partitions `c * CHUNK` on) as this mutation's own list, to
        read and replace entries in place; None if it holds no partition. For replay's
        loop over many changes: it saves a lookup per partition, and the caller must
        store only PartitionStates, over existing entries (the size does not change)."""
        key = (topic, c)
        own = self._work.get(key)
        if own is not None:
            return own
        chunk = self._chunks.get(key)
        if chunk is None:
            return None
        own = self._work[key] = list(chunk)
        return own

    def own_chunk(self, topic: str, c: int) -> list[PartitionState | None]:
        """Chunk `c` of `topic` as this mutation's own list, empty if it is new. For
        replay's loop over many new partitions: the caller stores PartitionStates in it
        (extending it with None up to an index past its end) and counts each entry it
        fills with `count_new`."""
        own = self.chunk(topic, c)
        if own is None:
            own = self._work[(topic, c)] = []
        return own

    def count_new(self, n: int) -> None:
        """`n` more partitions, stored by the caller in its `own_chunk` lists."""
        self._len += n

    _own = own_chunk

    def topic_states(self, topic: str, numbers: Iterable[int]) -> Iterator[PartitionState]:
        """The partitions `numbers` of `topic` that exist, as this mutation holds them."""
        last_c = None
        chunk: Any = None
        work = self._work
        for i in numbers:
            c = i >> CHUNK_BITS
            if c != last_c:
                chunk = work.get((topic, c))
                if chunk is None:
                    chunk = self._chunks.get((topic, c))
                last_c = c
            value = _at(chunk, i, None)
            if value is not None:
                yield value

    def drop_topic(self, topic: str, partitions: int) -> None:
        """Remove every partition of `topic` below `partitions`: one chunk at a time."""
        chunks = self._chunks
        for c in range((partitions + CHUNK - 1) >> CHUNK_BITS):
            key = (topic, c)
            chunk: Any = self._work.pop(key, None)
            if chunk is None:
                chunk = chunks.get(key)
            if key in chunks:
                chunks = chunks.delete(key)
            if chunk is not None:
                self._len -= sum(1 for v in chunk if v is not None)
        self._chunks = chunks

    def __setitem__(self, key: TopicPartition, value: PartitionState) -> None:
        if value is None:
            raise TypeError("a PartitionMap holds PartitionStates, not None")
        if value.tp is not key and value.tp != key:
            raise ValueError(f"the state of {value.tp} stored under {key}")
        topic, i = key
        chunk = self._own(topic, i >> CHUNK_BITS)
        j = i & CHUNK_MASK
        n = len(chunk)
        if j < n:
            if chunk[j] is None:
                self._len += 1
            chunk[j] = value
        else:
            if j > n:
                chunk.extend([None] * (j - n))
            chunk.append(value)
            self._len += 1

    def __delitem__(self, key: TopicPartition) -> None:
        if key not in self:
            raise KeyError(key)
        topic, i = key
        self._own(topic, i >> CHUNK_BITS)[i & CHUNK_MASK] = None
        self._len -= 1

    def finish(self) -> PartitionMap:
        """The edited map (the base itself if nothing was edited); editing may go on.

        Edited chunks are made canonical (a deletion may leave trailing holes or empty a
        chunk) and folded into the chunk map, which owns them from then on (`Chunk`)."""
        if not self._work:
            if self._chunks is not self._base._chunks:  # a topic was dropped
                self._base = PartitionMap._of(self._chunks, self._len)
            return self._base
        with self._chunks.mutate() as m:
            for key, chunk in self._work.items():
                while chunk and chunk[-1] is None:
                    chunk.pop()
                if chunk:
                    m[key] = chunk
                elif key in m:
                    del m[key]
            self._chunks = m.finish()
        self._work = {}
        self._base = PartitionMap._of(self._chunks, self._len)
        return self._base


EMPTY_PARTITIONS: Final = PartitionMap()
