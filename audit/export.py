"""``metactl log export``: the audit schema as Parquet, partitioned by date, without Spark.

The rows are exactly what the ``metactl`` data source produces (same columns, types and
derivations; see `audit.schema`), written with pyarrow as a Hive-style dataset
``OUT/date=YYYY-MM-DD/part-N.parquet`` (UTC dates of the batch timestamps). Every batch
is CRC-checked and decoded with `metadata_log.records.decode_batch` on the way. The audit
jobs read the result with ``--parquet OUT``.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from audit.logread import log_info
from audit.rows import RowBuilder, read_arrow
from audit.schema import arrow_schema
from audit.source import resolve_sources

DATE = "date"


@dataclass
class ExportReport:
    out: str
    records: int = 0
    dates: set[str] = field(default_factory=set)
    files: int = 0
    seconds: float = 0.0
    clusters: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        rate = self.records / self.seconds if self.seconds > 0 else 0.0
        span = f"{min(self.dates)} .. {max(self.dates)}" if self.dates else "no dates"
        return [
            f"exported {self.records:,} records of {', '.join(self.clusters)} to {self.out}",
            f"{self.files} Parquet file(s) in {len(self.dates)} date partition(s) ({span}); "
            f"{self.seconds:.1f} s, {rate:,.0f} records/s",
        ]


def export_parquet(
    data_dirs: Sequence[str],
    out: str | Path,
    *,
    clusters: Sequence[str] = (),
    overwrite: bool = False,
    validate: bool = True,
) -> ExportReport:
    """Write every record of the logs in `data_dirs` to a Parquet dataset in `out`."""
    started = time.perf_counter()
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        if not overwrite:
            raise FileExistsError(f"{target} exists and is not empty (use --overwrite)")
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink()
    sources = resolve_sources(list(data_dirs), list(clusters))
    schema = arrow_schema()
    with_date = schema.append(pa.field(DATE, pa.string()))
    report = ExportReport(out=str(target), clusters=[s.cluster for s in sources])

    def batches() -> Iterator[pa.RecordBatch]:
        for src in sources:
            info = log_info(src.path)
            builder = RowBuilder(src.cluster, validate=validate)
            for batch in read_arrow(info.path, info.start_offset, info.end_offset, builder):
                dates = pc.strftime(batch.column("timestamp"), format="%Y-%m-%d")
                report.records += batch.num_rows
                report.dates.update(pc.unique(dates).to_pylist())
                yield pa.RecordBatch.from_arrays([*batch.columns, dates], schema=with_date)

    target.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    ds.write_dataset(
        batches(),
        target,
        schema=with_date,
        format="parquet",
        partitioning=ds.partitioning(pa.schema([pa.field(DATE, pa.string())]), flavor="hive"),
        basename_template="part-{i}.parquet",
        existing_data_behavior="overwrite_or_ignore",
        max_rows_per_group=1 << 20,
        file_visitor=lambda f: written.append(f.path),
    )
    report.files = len(written)
    report.seconds = time.perf_counter() - started
    return report
