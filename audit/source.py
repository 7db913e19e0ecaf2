"""The ``metactl`` Spark data source: metadata logs as a DataFrame of the audit schema.

::

    from audit.source import register
    register(spark)
    df = spark.read.format("metactl").load("/var/lib/metactl")          # one data dir
    df = spark.read.format("metactl").load("/a/data,/b/data")           # several
    df = spark.read.format("metactl").option("paths", "/a,/b").load()

Options (all optional):

``paths``       comma-separated data directories (or log files), instead of load(path).
``cluster``     the ``cluster`` column: one name, or one per path (comma-separated).
                Default: each data directory's name (its full path if two names clash).
``columns``     comma-separated columns to produce (default: all, in schema order).
                Python data sources get no column pruning from Spark, so jobs say
                what they need here; decoding only those fields is much cheaper.
``types``       comma-separated record types to produce (default: all), e.g.
                ``RegisterBroker,FenceBroker``: other records are skipped after a cheap
                decode of their type tag.
``anyOf``       keep only records matching any of these comma-separated conditions:
                ``column=value`` or a bare ``column`` (is set), e.g.
                ``record_type=UncleanRecovery,leader=-1``. Filtering happens before
                the rows are built, which is what makes a selective scan cheap.
``partitionRecords``  records per input partition (default 1,000,000).
``partitions``  number of input partitions per log (overrides partitionRecords).
``validate``    ``true``: also decode every batch with `records.decode_batch`.
``prefilter``   ``false``: decode every batch even when ``types``/``anyOf`` could skip it
                by its bytes (see `audit.selection._patterns`; default ``true``).

Each input partition is an offset range of one log; its reader opens the SQLite file
read-only with the stdlib (no asyncio in executors), reads the stored batches whose base
offset falls in the range (so every record is read exactly once), checks their CRCs and
yields Arrow record batches. The offsets are fixed when the query is planned: records
appended later are not read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any, Final

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from audit.logread import cluster_name, log_info
from audit.rows import RowBuilder, read_arrow
from audit.schema import check_columns, check_types, spark_schema
from audit.selection import parse_any_of

FORMAT: Final = "metactl"
DEFAULT_PARTITION_RECORDS: Final = 1_000_000


@dataclass(frozen=True)
class LogSource:
    """One log to read: where it is and its cluster label."""

    path: str
    cluster: str


class OffsetRange(InputPartition):
    """Stored batches of one log whose base offset is in [start, end)."""

    def __init__(self, path: str, cluster: str, start: int, end: int) -> None:
        super().__init__((path, start, end))
        self.path = path
        self.cluster = cluster
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"OffsetRange({self.cluster}: {self.path} [{self.start}, {self.end}))"


def _split(text: str | None) -> list[str]:
    if not text:
        return []
    return [part.strip() for part in text.split(",") if part.strip()]


def resolve_sources(paths: Sequence[str], clusters: Sequence[str] = ()) -> list[LogSource]:
    """Pair paths with cluster names (given, or the directory names, made unique)."""
    if not paths:
        raise ValueError("the metactl data source needs a path: load(DIR) or option paths")
    if clusters and len(clusters) not in (1, len(paths)):
        raise ValueError(
            f"option cluster names {len(clusters)} clusters for {len(paths)} paths; "
            "give one name or one per path"
        )
    if len(clusters) == 1 and len(paths) > 1:
        raise ValueError("one cluster name for several paths would mix their logs")
    names = list(clusters) if clusters else [cluster_name(p) for p in paths]
    if not clusters and len(set(names)) != len(names):
        names = [str(Path(p).resolve()) for p in paths]
    if len(set(names)) != len(names):
        raise ValueError(f"cluster names must be distinct, got {names}")
    return [LogSource(str(p), c) for p, c in zip(paths, names, strict=True)]


class MetactlDataSource(DataSource):
    """``spark.read.format("metactl")``: see the module documentation."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _options(self) -> dict[str, str]:
        return {str(k).lower(): str(v) for k, v in dict(self.options).items()}

    def _columns(self) -> tuple[str, ...]:
        return check_columns(_split(self._options().get("columns")) or None)

    def schema(self) -> Any:
        return spark_schema(self._columns())

    def reader(self, schema: Any) -> MetactlReader:
        opts = self._options()
        paths = _split(opts.get("paths")) or _split(opts.get("path"))
        sources = resolve_sources(paths, _split(opts.get("cluster")))
        per = int(opts.get("partitionrecords", DEFAULT_PARTITION_RECORDS))
        count = int(opts["partitions"]) if "partitions" in opts else None
        if per < 1 or (count is not None and count < 1):
            raise ValueError("partitions and partitionRecords must be positive")
        validate = opts.get("validate", "false").lower() == "true"
        prefilter = opts.get("prefilter", "true").lower() != "false"
        columns = tuple(f.name for f in schema.fields)
        check_columns(columns)
        types = check_types(_split(opts.get("types")) or None)
        any_of = parse_any_of(opts.get("anyof", ""))
        return MetactlReader(
            sources,
            columns=columns,
            types=types,
            partition_records=per,
            partition_count=count,
            validate=validate,
            any_of=any_of,
            prefilter=prefilter,
        )


class MetactlReader(DataSourceReader):
    def __init__(
        self,
        sources: list[LogSource],
        *,
        columns: tuple[str, ...],
        types: frozenset[str] | None,
        partition_records: int,
        partition_count: int | None,
        validate: bool,
        any_of: Sequence[tuple[str, Any]],
        prefilter: bool = True,
    ) -> None:
        self.sources = sources
        self.columns = columns
        self.types = types
        self.partition_records = partition_records
        self.partition_count = partition_count
        self.validate = validate
        self.any_of = tuple(any_of)
        self.prefilter = prefilter

    def partitions(self) -> list[OffsetRange]:
        out: list[OffsetRange] = []
        for src in self.sources:
            info = log_info(src.path)
            out.extend(
                plan_ranges(
                    info.path,
                    src.cluster,
                    info.start_offset,
                    info.end_offset,
                    partition_records=self.partition_records,
                    partition_count=self.partition_count,
                )
            )
        return out or [OffsetRange(self.sources[0].path, self.sources[0].cluster, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, OffsetRange)
        if partition.end <= partition.start:
            return
        builder = RowBuilder(
            partition.cluster,
            self.columns,
            self.types,
            validate=self.validate,
            any_of=self.any_of,
            prefilter=self.prefilter,
        )
        yield from read_arrow(partition.path, partition.start, partition.end, builder)


def plan_ranges(
    path: str,
    cluster: str,
    start: int,
    end: int,
    *,
    partition_records: int = DEFAULT_PARTITION_RECORDS,
    partition_count: int | None = None,
) -> list[OffsetRange]:
    """Split [start, end) into contiguous offset ranges; empty logs give no range."""
    total = end - start
    if total <= 0:
        return []
    n = partition_count or -(-total // partition_records)
    n = max(1, min(n, total))
    bounds = [start + total * i // n for i in range(n + 1)]
    # The last range is open-ended so a batch that starts before `end` is never lost.
    return [
        OffsetRange(path, cluster, lo, hi if i < n - 1 else end)
        for i, (lo, hi) in enumerate(pairwise(bounds))
    ]


def register(spark: Any) -> None:
    """Make ``spark.read.format("metactl")`` available in this session."""
    spark.dataSource.register(MetactlDataSource)
