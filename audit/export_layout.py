"""The layout of a `metactl log export`: where each record goes, and the manifest.

Layout (version 2; a Hive-style ``kind`` partition column)::

    OUT/_metactl.json                              the manifest (below)
    OUT/kind=partition/part-TTTT-bBBB.parquet      Partition, PartitionChange, UncleanRecovery
    OUT/kind=cluster/part-TTTT.parquet             every other record

* ``kind=partition`` holds the records of partitions (99% of a log), split into
  ``buckets`` files per export task by a hash of (cluster, topic, partition)
  (`partition_buckets`): a partition's whole history is in the files of one bucket, so
  the ``invariants`` job checks each bucket in a task of its own with no shuffle.
* ``kind=cluster`` holds brokers, topics, configs, features, transaction markers and
  ClearElr/RemoveTopic records: a job that wants only those (``brokers``, the marker
  scan) prunes every partition file by the directory alone.
* A bucket file holds its task's records in offset order (the order the check replays);
  in the ``kind=cluster`` files row groups hold one record type at a time where they can,
  so a filter on ``record_type`` skips row groups by their statistics.
* The manifest (JSON; Spark and pyarrow ignore files starting with ``_``) records the
  layout version, the bucket count, and per cluster its record count, offsets, time span
  and the offset ranges of aborted or unfinished transactions: the jobs read those from it
  (`read_manifest`) instead of scanning for them.

Shared by the writer (`audit.export`) and the readers (`audit.buckets`, `audit.spark`),
so that a reader never imports the writer. It must not read or write records itself.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa

KIND: Final = "kind"
PARTITION_KIND: Final = "partition"
CLUSTER_KIND: Final = "cluster"
PARTITION_TYPES: Final = frozenset({"Partition", "PartitionChange", "UncleanRecovery"})
MANIFEST: Final = "_metactl.json"
FORMAT_NAME: Final = "metactl-audit-export"
LAYOUT_VERSION: Final = 2


def partition_buckets(cluster: str, topics: Any, partitions: Any, buckets: int) -> Any:
    """The bucket of each (cluster, topic, partition): crc32 of the cluster and topic,
    mixed with the partition number (a numpy int64 array). Stable across processes and
    runs; only the export computes it (readers find a bucket by its file names)."""
    if isinstance(topics, pa.ChunkedArray):
        topics = topics.combine_chunks()
    if isinstance(partitions, pa.ChunkedArray):
        partitions = partitions.combine_chunks()
    encoded = topics.dictionary_encode()
    names = encoded.dictionary.to_pylist()
    hashes = np.array(
        [zlib.crc32(f"{cluster}\x00{name}".encode()) for name in names], dtype=np.uint64
    )
    per_row = hashes[encoded.indices.to_numpy(zero_copy_only=False)]
    part = partitions.to_numpy(zero_copy_only=False).astype(np.uint64)
    mixed = (per_row ^ ((part * np.uint64(0x9E3779B1)) & np.uint64(0xFFFFFFFF))) * np.uint64(
        0x85EBCA6B
    )
    return ((mixed >> np.uint64(16)) % np.uint64(buckets)).astype(np.int64)


def bucket_file_glob(bucket: int) -> str:
    return f"part-*-b{bucket:03d}.parquet"


@dataclass(frozen=True)
class Manifest:
    """What an export's `MANIFEST` says (see the module documentation)."""

    buckets: int
    clusters: dict[str, dict[str, Any]]

    def aborted(self) -> dict[str, list[tuple[int, int]]]:
        found = {c: [(int(a), int(b)) for a, b in v["aborted"]] for c, v in self.clusters.items()}
        return {c: r for c, r in found.items() if r}

    def last_ms(self) -> dict[str, int]:
        return {c: int(v["last_ms"]) for c, v in self.clusters.items() if v["last_ms"] is not None}


def read_manifest(path: str) -> Manifest | None:
    """The manifest of a (local) export of this layout; None for anything else (an older
    export, a URL, another producer): readers then scan for what it would have said."""
    url = urlsplit(path)
    if url.scheme not in ("", "file"):
        return None
    local = Path(url.path) if url.scheme == "file" else Path(path)
    try:
        data = json.loads((local / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if data.get("format") != FORMAT_NAME or data.get("version") != LAYOUT_VERSION:
        return None
    return Manifest(buckets=int(data["buckets"]), clusters=dict(data["clusters"]))
