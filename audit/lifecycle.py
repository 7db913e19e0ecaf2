"""What the audits learn from a log's topic and broker records: topic generations, and
whether the log ends with the cluster stopped cleanly (issue 34).

* **Generations.** A topic deleted and created again under its name is a new topic with
  a new id (KIP-516); its partitions share nothing with the old ones. Partition records
  name their topic only, so a partition record belongs to the generation of that name
  current at its offset: the last TopicRecord of the name before it (a TopicRecord that
  grows a topic keeps its id: not a new generation). Every audit keys partitions by
  (cluster, topic, topic_id, partition) and shows the name, with the id where two
  generations of a name are in the log (`Lifecycle.label`). A topic whose creation is
  not in the log (it starts after a snapshot) gets the id ``""`` (unknown), and its
  deletion is not seen by the measures keyed by id (audit/README.md, known limits).
* **The final shutdown.** A cluster stopped cleanly (``cluster up``'s Ctrl-C, ``make
  run``'s) writes a controlled shutdown (a BrokerRegistrationChange setting
  ``in_controlled_shutdown``) for every broker, the last of which leaves partitions
  without a leader, and then the controller stops: no record says the cluster is down.
  The log *ends stopped* when every broker it knows (registered, not unregistered) is
  in controlled shutdown or fenced at its end, and at least one went through a
  controlled shutdown since a broker last came up (a registration or an unfence) or
  failed (a fence of a broker that was not shutting down). The final shutdown starts at
  the first of those controlled shutdowns (`Lifecycle.stops`: its offset and time, per
  cluster). A partition that lost its leader at or after that
  offset and has none at the end was *stopped with the cluster*: not an outage still
  open. A cluster whose brokers were all fenced without a controlled shutdown (a crash,
  a network partition) did not stop cleanly: its partitions are offline.

`LifecycleTracker` is fed the records in offset order, one cluster after another or
interleaved (the plain pass feeds decoded records, `feed_record`; readers of rows feed
columns, `feed_table`); `Lifecycle` is what it found, plain values that pickle to
executors, with the lookups the jobs use (`topic_ids`, vectorised; `spans` for a Spark
range join). It must not read logs or run Spark (`audit.jobs.common.lifecycle` does).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metadata_log.records import (
    BrokerRegistrationChangeRecord,
    FenceBrokerRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
)

# What a Lifecycle is made of: these record types, these columns of the audit schema.
TYPES: Final = (
    "Topic",
    "RemoveTopic",
    "RegisterBroker",
    "FenceBroker",
    "UnfenceBroker",
    "BrokerRegistrationChange",
    "UnregisterBroker",
)
COLUMNS: Final = (
    "cluster",
    "offset",
    "timestamp",
    "record_type",
    "topic",
    "topic_id",
    "broker",
    "reason",
)
UNKNOWN_ID: Final = ""  # a partition of a topic whose creation and deletion are not in the log
_END: Final = 2**62  # past every offset

Key = tuple[str, str]  # (cluster, topic name) or (cluster, topic id)


@dataclass(frozen=True)
class Stop:
    """Where a cluster's final, clean shutdown started: its first controlled shutdown."""

    offset: int
    ts_ms: int


@dataclass(frozen=True)
class Lifecycle:
    """Generations of topic names, deleted generations and final shutdowns (see the module
    documentation)."""

    # (cluster, name) -> ((creation offset, topic id), ...) in offset order
    generations: dict[Key, tuple[tuple[int, str], ...]] = field(default_factory=dict)
    # (cluster, topic id) -> (offset, ms) of its RemoveTopicRecord
    removed: dict[Key, tuple[int, int]] = field(default_factory=dict)
    stops: dict[str, Stop] = field(default_factory=dict)

    def topic_id_at(self, cluster: str, name: str, offset: int) -> str:
        gens = self.generations.get((cluster, name))
        if not gens:
            return UNKNOWN_ID
        k = bisect_right(gens, offset, key=lambda g: g[0]) - 1
        return gens[k][1] if k >= 0 else UNKNOWN_ID

    def topic_ids(self, clusters: Any, topics: Any, offsets: Any) -> pa.Array:
        """`topic_id_at` of every row (Arrow or numpy columns of equal length), vectorised:
        a name with one generation is one lookup, only names created again search offsets."""
        offsets = np.asarray(offsets, dtype=np.int64)
        n = len(offsets)
        if not self.generations or not n:
            return pa.array([UNKNOWN_ID] * n, pa.string())
        keys = pc.binary_join_element_wise(
            _strings(clusters).fill_null(""), _strings(topics).fill_null(""), "\x00"
        )
        enc = keys.dictionary_encode()
        codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        flat = [UNKNOWN_ID]
        first = np.zeros(len(enc.dictionary), dtype=np.int64)  # 0: unknown
        start = np.zeros(len(enc.dictionary), dtype=np.int64)
        again: list[tuple[int, tuple[tuple[int, str], ...]]] = []
        for code, key in enumerate(enc.dictionary.to_pylist()):
            cluster, _, name = key.partition("\x00")
            gens = self.generations.get((cluster, name))
            if not gens:
                continue
            if len(gens) == 1:
                first[code], start[code] = len(flat), gens[0][0]
                flat.append(gens[0][1])
            else:
                again.append((code, gens))
        pos = np.where(offsets >= start[codes], first[codes], 0)
        for code, gens in again:
            mine = np.flatnonzero(codes == code)
            starts = np.array([g[0] for g in gens], dtype=np.int64)
            k = np.searchsorted(starts, offsets[mine], side="right") - 1
            pos[mine] = np.where(k >= 0, len(flat) + k, 0)
            flat.extend(g[1] for g in gens)
        return pa.array(flat, pa.string()).take(pa.array(pos))

    def spans(self) -> list[tuple[str, str, str, int, int]]:
        """(cluster, name, topic id, first offset, end offset): each generation's offsets,
        for a range join (Spark's rows paths); a generation ends where the next begins."""
        out = []
        for (cluster, name), gens in self.generations.items():
            for i, (lo, tid) in enumerate(gens):
                hi = gens[i + 1][0] if i + 1 < len(gens) else _END
                out.append((cluster, name, tid, lo, hi))
        return out

    def shared(self, cluster: str, name: str) -> bool:
        """Two generations of this name are in the log: people need the id too."""
        return len(self.generations.get((cluster, name), ())) > 1

    def label(self, cluster: str, name: str, topic_id: str) -> str:
        """The topic for people: its name, and its id where the name was used twice."""
        if topic_id and self.shared(cluster, name):
            return f"{name} (topic id {topic_id})"
        return name

    def partition_label(self, cluster: str, name: str, topic_id: str, partition: int) -> str:
        """``orders-0``, or ``orders-0 (topic id ...)`` where the name was used twice."""
        if topic_id and self.shared(cluster, name):
            return f"{name}-{partition} (topic id {topic_id})"
        return f"{name}-{partition}"

    def removal_ms(self, cluster: str, topic_id: str) -> int | None:
        found = self.removed.get((cluster, topic_id)) if topic_id else None
        return None if found is None else found[1]

    def removal_offsets(self) -> dict[Key, int]:
        return {k: v[0] for k, v in self.removed.items()}


class _Brokers:
    """One cluster's brokers as far as stopping goes: which are up, and since when all
    the controlled shutdowns of the current stopping went on (None: nobody is stopping)."""

    __slots__ = ("since", "up")

    def __init__(self) -> None:
        self.up: set[int] = set()
        self.since: Stop | None = None


class LifecycleTracker:
    """Builds a `Lifecycle` from records fed in offset order (per cluster)."""

    def __init__(self) -> None:
        self._gens: dict[Key, list[tuple[int, str]]] = {}
        self._removed: dict[Key, tuple[int, int]] = {}
        self._brokers: dict[str, _Brokers] = {}

    # --- topics --------------------------------------------------------------------------

    def topic(self, cluster: str, offset: int, name: str, topic_id: str) -> None:
        gens = self._gens.setdefault((cluster, name), [])
        if not gens or gens[-1][1] != topic_id:  # the same id again: the topic grew
            gens.append((offset, topic_id))

    def removal(self, cluster: str, offset: int, ts_ms: int, name: str, topic_id: str) -> None:
        del name  # the id says which generation
        self._removed[(cluster, topic_id)] = (offset, ts_ms)

    def topic_id_at(self, cluster: str, name: str, offset: int) -> str:
        """The generation current at `offset` from what was fed so far (the plain pass
        asks while it feeds: a batch's topic records are fed before its partitions')."""
        gens = self._gens.get((cluster, name))
        if not gens:
            return UNKNOWN_ID
        if gens[-1][0] <= offset:
            return gens[-1][1]
        k = bisect_right(gens, offset, key=lambda g: g[0]) - 1
        return gens[k][1] if k >= 0 else UNKNOWN_ID

    # --- brokers -------------------------------------------------------------------------

    def broker(  # noqa: PLR0917 - a row's columns, in the schema's order
        self, cluster: str, offset: int, ts_ms: int, record_type: str, broker: int, reason: Any
    ) -> None:
        """A broker record, as the audit schema's columns say it (``reason`` of a
        BrokerRegistrationChange: controlled_shutdown, fenced or unfenced)."""
        s = self._brokers.get(cluster)
        if s is None:
            s = self._brokers[cluster] = _Brokers()
        change = record_type == "BrokerRegistrationChange"
        if record_type in ("RegisterBroker", "UnfenceBroker") or (change and reason == "unfenced"):
            s.up.add(broker)
            s.since = None
        elif change and reason == "controlled_shutdown":
            s.up.discard(broker)
            if s.since is None:
                s.since = Stop(offset, ts_ms)
        elif record_type == "FenceBroker" or (change and reason == "fenced"):
            if broker in s.up:  # it failed (it was not shutting down): no clean stop yet
                s.since = None
            s.up.discard(broker)
        elif record_type == "UnregisterBroker":
            s.up.discard(broker)

    # --- feeding ---------------------------------------------------------------------------

    def feed_record(self, cluster: str, offset: int, ts_ms: int, r: Any) -> None:
        """One decoded record (of the types in `_FED`; others are ignored)."""
        kind = type(r)
        if kind is TopicRecord:
            self.topic(cluster, offset, r.name, r.topic_id)
        elif kind is RemoveTopicRecord:
            self.removal(cluster, offset, ts_ms, r.name, r.topic_id)
        elif kind is RegisterBrokerRecord:
            self.broker(cluster, offset, ts_ms, "RegisterBroker", r.broker_id, None)
        elif kind is UnfenceBrokerRecord:
            self.broker(cluster, offset, ts_ms, "UnfenceBroker", r.broker_id, None)
        elif kind is FenceBrokerRecord:
            self.broker(cluster, offset, ts_ms, "FenceBroker", r.broker_id, r.reason)
        elif kind is UnregisterBrokerRecord:
            self.broker(cluster, offset, ts_ms, "UnregisterBroker", r.broker_id, None)
        elif kind is BrokerRegistrationChangeRecord:
            reason = None
            if r.in_controlled_shutdown:
                reason = "controlled_shutdown"
            elif r.fenced is not None:
                reason = "fenced" if r.fenced else "unfenced"
            self.broker(cluster, offset, ts_ms, "BrokerRegistrationChange", r.broker_id, reason)

    def feed_batch(self, cluster: str, base: int, ts_ms: int, records: Any) -> None:
        """A stored batch's records (the plain pass feeds every batch: one set lookup for
        each of the many records of no interest)."""
        fed = _FED
        for i, r in enumerate(records):
            if type(r) in fed:
                self.feed_record(cluster, base + i, ts_ms, r)

    def feed_table(self, table: pa.Table) -> None:
        """Rows of `COLUMNS` (committed, before --until), any order: fed in offset order
        per cluster."""
        if not table.num_rows:
            return
        ms = pc.divide(table.column("timestamp").cast(pa.int64()), 1000)
        cols = {c: table.column(c).to_pylist() for c in COLUMNS if c != "timestamp"}
        cols["ms"] = ms.to_pylist()
        order = sorted(range(table.num_rows), key=lambda i: (cols["cluster"][i], cols["offset"][i]))
        for i in order:
            cluster, offset, ts, rt = (
                cols["cluster"][i],
                cols["offset"][i],
                cols["ms"][i],
                cols["record_type"][i],
            )
            if rt == "Topic":
                self.topic(cluster, offset, cols["topic"][i], cols["topic_id"][i])
            elif rt == "RemoveTopic":
                self.removal(cluster, offset, ts, cols["topic"][i], cols["topic_id"][i])
            elif rt in TYPES:
                self.broker(cluster, offset, ts, rt, cols["broker"][i], cols["reason"][i])

    def result(self) -> Lifecycle:
        stops = {
            cluster: s.since
            for cluster, s in self._brokers.items()
            if s.since is not None and not s.up
        }
        return Lifecycle(
            generations={k: tuple(v) for k, v in self._gens.items() if v},
            removed=dict(self._removed),
            stops=stops,
        )


_FED: Final = frozenset(
    {
        TopicRecord,
        RemoveTopicRecord,
        RegisterBrokerRecord,
        UnfenceBrokerRecord,
        FenceBrokerRecord,
        UnregisterBrokerRecord,
        BrokerRegistrationChangeRecord,
    }
)


def topic_keys(topics: Any, topic_ids: Any) -> pa.Array:
    """One string per row naming its topic's generation (name and id; `split_keys` parts
    them again): what the numpy paths group and encode by."""
    return pc.binary_join_element_wise(
        _strings(topics).fill_null(""), _strings(topic_ids).fill_null(UNKNOWN_ID), "\x00"
    )


def split_keys(keys: Any) -> tuple[pa.Array, pa.Array]:
    """`topic_keys`' strings (e.g. a dictionary's) back into (names, topic ids)."""
    parts = [k.partition("\x00") for k in _strings(keys).to_pylist()]
    return pa.array([p[0] for p in parts], pa.string()), pa.array(
        [p[2] for p in parts], pa.string()
    )


def _strings(values: Any) -> pa.Array:
    """A column as a plain string Arrow array (a chunked or dictionary one too)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not isinstance(values, pa.Array):
        values = pa.array(values, pa.string())
    if pa.types.is_dictionary(values.type):
        values = values.cast(pa.string())
    return values
