"""The image's partitions: a persistent map from (topic, partition) to `PartitionState`.

Owns the storage of the image's partitions and its copy-on-write mutation, which replay
uses to build the next image. Must not know any rule, hold anything but partition
states, or change a map that has been handed out.

Why not one HAMT keyed by (topic, partition) (`immutables.Map`, which the image used
before): a fence at 100,000 partitions changes 10,000 of them, and 10,000 HAMT inserts
copied and re-linked nodes at about 0.8 µs each (7.5 ms of a 32 ms step, measured with
`bench/controller_ops.py`'s cluster), and every key was a tuple object kept alive for the
life of the image. Partition numbers are dense within a topic, so here a topic holds its
partitions in chunks of `CHUNK` consecutive numbers: a dict from chunk number to a tuple
of states, with `None` in the holes. A topic map (a HAMT, by name) points at each topic's
chunk dict. Changing a partition copies its chunk (at most 256 pointers) and, once per
mutation, its topic's chunk dict; copying a whole 100,000-partition image this way costs
about 0.4 ms. Lookups cost a HAMT lookup by name, a dict lookup and a tuple index, and no
key tuple is hashed.

Chunks are stored canonically (no trailing `None`, no empty chunk, no empty topic), so
two maps with the same content compare equal by comparing their parts. Iteration visits
topics in the topic map's order and each topic's partitions in chunk order; like the HAMT
before it, it is not sorted, and callers that need an order sort.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import immutables

if TYPE_CHECKING:  # image.py imports this module: no import of it at run time
    from metadata_image.image import PartitionState, TopicPartition

CHUNK_BITS: Final = 8
CHUNK: Final = 1 << CHUNK_BITS
CHUNK_MASK: Final = CHUNK - 1

Chunk: TypeAlias = "tuple[PartitionState | None, ...]"
Chunks: TypeAlias = dict[int, Chunk]

_MISSING: Any = object()


class PartitionMap(Mapping["TopicPartition", "PartitionState"]):
    """An immutable map (topic, partition) -> PartitionState; `mutate()` edits a copy."""

    __slots__ = ("_len", "_topics")

    _topics: immutables.Map[str, Chunks]
    _len: int

    def __init__(
        self,
        items: Mapping[TopicPartition, PartitionState]
        | Iterable[tuple[TopicPartition, PartitionState]] = (),
    ) -> None:
        m = _Mutation(immutables.Map(), 0)
        pairs = items.items() if isinstance(items, Mapping) else items
        for key, value in pairs:
            m[key] = value
        self._topics, self._len = m.parts()

    @classmethod
    def _of(cls, topics: immutables.Map[str, Chunks], size: int) -> PartitionMap:
        out = cls.__new__(cls)
        out._topics = topics
        out._len = size
        return out

    # --- reading ------------------------------------------------------------------------

    def get(self, key: Any, default: Any = None) -> Any:
        try:
            topic, i = key
            chunks = self._topics.get(topic)
            if chunks is None:
                return default
            chunk = chunks.get(i >> CHUNK_BITS)
        except (TypeError, ValueError):
            return default
        if chunk is None:
            return default
        j = i & CHUNK_MASK
        if j < len(chunk):
            value = chunk[j]
            if value is not None:
                return value
        return default

    def __getitem__(self, key: TopicPartition) -> PartitionState:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value  # type: ignore[no-any-return]

    def __contains__(self, key: object) -> bool:
        return self.get(key, _MISSING) is not _MISSING

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[TopicPartition]:
        for topic, chunks in self._topics.items():
            for c, chunk in chunks.items():
                first = c << CHUNK_BITS
                for j, value in enumerate(chunk):
                    if value is not None:
                        yield (topic, first + j)

    def keys(self) -> KeysView[TopicPartition]:
        return KeysView(self)

    def values(self) -> ValuesView[PartitionState]:
        return _Values(self)

    def items(self) -> ItemsView[TopicPartition, PartitionState]:
        return _Items(self)

    def _values(self) -> Iterator[PartitionState]:
        for chunks in self._topics.values():
            for chunk in chunks.values():
                for value in chunk:
                    if value is not None:
                        yield value

    def of_topic(self, topic: str, numbers: Iterable[int]) -> Iterator[PartitionState]:
        """The partitions `numbers` of `topic`, in that order; KeyError for one missing.

        `ClusterImage.partitions_of` walks a broker's replicas with this: one topic lookup
        for all of a topic's partitions rather than one per partition."""
        chunks = self._topics.get(topic)
        if chunks is None:
            for i in numbers:
                raise KeyError((topic, i))
            return
        for i in numbers:
            chunk = chunks.get(i >> CHUNK_BITS)
            j = i & CHUNK_MASK
            value = None if chunk is None or j >= len(chunk) else chunk[j]
            if value is None:
                raise KeyError((topic, i))
            yield value

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PartitionMap):
            return self._len == other._len and self._topics == other._topics
        if isinstance(other, Mapping):
            return len(self) == len(other) and all(
                other.get(k, _MISSING) == v for k, v in self.items()
            )
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PartitionMap(<{self._len} partitions in {len(self._topics)} topics>)"

    # --- new maps -----------------------------------------------------------------------

    def mutate(self) -> PartitionMapMutation:
        return PartitionMapMutation(self)

    def set(self, key: TopicPartition, value: PartitionState) -> PartitionMap:
        m = self.mutate()
        m[key] = value
        return m.finish()

    def delete(self, key: TopicPartition) -> PartitionMap:
        m = self.mutate()
        del m[key]
        return m.finish()


class _Values(ValuesView["PartitionState"]):
    _mapping: PartitionMap

    def __iter__(self) -> Iterator[PartitionState]:
        return self._mapping._values()


class _Items(ItemsView["TopicPartition", "PartitionState"]):
    _mapping: PartitionMap

    def __iter__(self) -> Iterator[tuple[TopicPartition, PartitionState]]:
        for value in self._mapping._values():
            yield (value.topic, value.partition), value


class _Mutation:
    """The copy-on-write editing shared by `PartitionMapMutation` and the constructor.

    `_work` holds the topics edited so far: a private copy of each one's chunk dict, in
    which a chunk this mutation has written is a list (its own) and any other chunk is the
    shared tuple."""

    __slots__ = ("_len", "_topics", "_work")

    def __init__(self, topics: immutables.Map[str, Chunks], size: int) -> None:
        self._topics = topics
        self._len = size
        self._work: dict[str, dict[int, Chunk | list[PartitionState | None]]] = {}

    def get(self, key: TopicPartition, default: Any = None) -> Any:
        topic, i = key
        chunks: Mapping[int, Any] | None = self._work.get(topic)
        if chunks is None:
            chunks = self._topics.get(topic)
            if chunks is None:
                return default
        chunk = chunks.get(i >> CHUNK_BITS)
        if chunk is None:
            return default
        j = i & CHUNK_MASK
        if j < len(chunk):
            value = chunk[j]
            if value is not None:
                return value
        return default

    def __getitem__(self, key: TopicPartition) -> PartitionState:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value  # type: ignore[no-any-return]

    def __contains__(self, key: TopicPartition) -> bool:
        return self.get(key, _MISSING) is not _MISSING

    def __len__(self) -> int:
        return self._len

    def chunk(self, topic: str, c: int) -> list[PartitionState | None] | None:
        """Chunk `c` of `topic` (partitions `c * CHUNK` on) as this mutation's own list, to
        read and replace entries in place; None if it holds no partition. For replay's
        loop over many changes: it saves a lookup per partition, and the caller must
        store only PartitionStates, over existing entries (the size does not change)."""
        chunks = self._work.get(topic)
        if chunks is None:
            base = self._topics.get(topic)
            if base is None or c not in base:
                return None
        elif c not in chunks:
            return None
        return self._chunk(topic, c)

    def _chunk(self, topic: str, c: int) -> list[PartitionState | None]:
        """Chunk `c` of `topic`, as this mutation's own list."""
        chunks = self._work.get(topic)
        if chunks is None:
            base = self._topics.get(topic)
            chunks = self._work[topic] = {} if base is None else dict(base)
        chunk = chunks.get(c)
        if type(chunk) is list:
            return chunk
        own: list[PartitionState | None] = [] if chunk is None else list(chunk)
        chunks[c] = own
        return own

    def __setitem__(self, key: TopicPartition, value: PartitionState) -> None:
        if value is None:
            raise TypeError("a PartitionMap holds PartitionStates, not None")
        topic, i = key
        chunk = self._chunk(topic, i >> CHUNK_BITS)
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
        self._chunk(topic, i >> CHUNK_BITS)[i & CHUNK_MASK] = None
        self._len -= 1

    def parts(self) -> tuple[immutables.Map[str, Chunks], int]:
        """The edited topics, made canonical and immutable, folded into the topic map."""
        if self._work:
            with self._topics.mutate() as m:
                for topic, chunks in self._work.items():
                    out: Chunks = {}
                    for c, chunk in chunks.items():
                        if type(chunk) is list:
                            while chunk and chunk[-1] is None:
                                chunk.pop()
                            if not chunk:
                                continue
                            out[c] = tuple(chunk)
                        else:
                            out[c] = chunk  # type: ignore[assignment]
                    if out:
                        m[topic] = out
                    elif topic in m:
                        del m[topic]
                self._topics = m.finish()
            self._work = {}
        return self._topics, self._len


class PartitionMapMutation(_Mutation):
    """A working copy of a `PartitionMap`: read, set and delete, then `finish()`."""

    __slots__ = ("_base",)

    def __init__(self, base: PartitionMap) -> None:
        super().__init__(base._topics, base._len)
        self._base = base

    def finish(self) -> PartitionMap:
        """The edited map (the base itself if nothing was edited); editing may go on."""
        if not self._work:
            return self._base
        topics, size = self.parts()
        self._base = PartitionMap._of(topics, size)
        return self._base


EMPTY_PARTITIONS: Final = PartitionMap()
