"""Benchmark of the Spark audits against a plain single-process pass over the same logs.

Run ``python bench/spark_audit.py [--sizes 1M,10M] [--master local[2]] [--json]``. For each
size, in the same run and on the same log:

* ``metactl log export`` of the log to Parquet, timed (records/s, and CPU seconds per
  record of every process it ran; with ``--one-process-export`` also the same export in
  one process, for its speed-up); ``--only-export`` times the export alone (no Spark);
* every job (``--jobs``) on Spark, warm session, results collected, from each source
  (``--sources``): ``parquet`` (the export: buckets, pruning) and ``sqlite`` (the
  ``metactl`` data source over the log, or the jobs' logs methods);
* the plain pass (`audit.plain.run_jobs`, one job at a time): stdlib SQLite, msgspec
  ``decode_batch`` of every batch, plain Python for the same answers (the same
  invariant checker), the garbage collector paused as in the Spark tasks.

It prints each job's times and speed-up (plain / Spark) per source, and how Spark's time
grew from the smallest size; with ``--json`` one JSON object per line instead (``job``,
``source``, ``records``, ``speedup``, times; the export as job ``log-export``). Every
Spark answer is compared with the plain pass's (summary and statistics); a mismatch fails
the run.

``python bench/spark_audit.py --cli [--repeat N]`` measures instead what an operator waits
for (issue 13): ``metactl audit elections`` on a ~30k-record log, one fresh process per
run, its wall time beside Spark's start-up time, with the class-data sharing archive
(`audit.cds`, in a temporary cache) and without it.

Logs: a base history is simulated once (``metactl simulate history``: 30 brokers, 5000
partitions, days enough for ~1M records), then larger logs are tiled from it
(`audit.tile`: copy k of the base appended with its broker ids, topic names, broker epochs
and timestamps shifted, so the big log is k independent, healthy sub-clusters one after
another). Logs and exports are kept under ``--dir`` (default ``bench/out/spark-audit``) and
reused by later runs (exports are rewritten, to time them). `bench/spark_cluster.py` runs
``audit all`` on a standalone cluster on the same logs.

Where the time goes is in audit/README.md (Spark event logs: per-stage task and CPU
time, shuffle bytes). This script measures; it must not be imported by the product.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import resource
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from audit.logread import log_info
from audit.tile import tile_log
from metactl.logs import configure
from metadata_log.sqlite_format import LOG_FILE_NAME
from simulation.history import simulate_history
from simulation.history_config import HistoryConfig

BASE_DAYS = 12.0  # 30 brokers / 5000 partitions make ~90k records a day


def parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1_000, "M": 1_000_000}.get(text[-1:], 1)
    return int(float(text.rstrip("KM")) * scale)


# --- logs -----------------------------------------------------------------------------------


def _simulated(root: Path, name: str, cfg: HistoryConfig) -> Path:
    """A simulated history in ``root/name``, made by the first run and reused by later ones."""
    path = root / name
    if not (path / LOG_FILE_NAME).exists():
        shutil.rmtree(path, ignore_errors=True)
        print(f"simulating a history ({cfg.days:g} days) into {path} ...", flush=True)
        report = asyncio.run(simulate_history(cfg, path))
        print("  " + "; ".join(report.lines()[:2]), flush=True)
    return path


def base_log(root: Path) -> Path:
    # A power outage every other day: hundreds of offline partitions and recoveries each.
    cfg = HistoryConfig(brokers=30, partitions=5000, days=BASE_DAYS, seed=966, outages=0.5)
    return _simulated(root, "base", cfg)


def sized_log(root: Path, size: int) -> Path:
    base = base_log(root)
    path = root / f"tiled-{size}"
    if not (path / LOG_FILE_NAME).exists():
        shutil.rmtree(path, ignore_errors=True)
        started = time.perf_counter()
        n = tile_log(base, path, size)
        dt = time.perf_counter() - started
        print(f"tiled {n:,} records into {path} in {dt:.1f} s ({n / dt:,.0f} records/s)")
    return path


# --- measuring ----------------------------------------------------------------------------

JOBS = ("elections", "unclean-recoveries", "offline", "brokers", "invariants")


@dataclass
class Row:
    size: int
    records: int
    job: str
    source: str  # parquet | sqlite
    spark_s: float
    plain_s: float
    answer: str

    @property
    def speedup(self) -> float:
        return self.plain_s / self.spark_s if self.spark_s else 0.0


@dataclass
class ExportRow:
    records: int
    seconds: float
    one_process_s: float | None
    workers: int
    megabytes: float
    cpu_s: float = 0.0  # this process and its children (the pool), user + system
    one_process_cpu_s: float | None = None

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    @property
    def cpu_us(self) -> float:
        """CPU microseconds per record, over every process of the export."""
        return self.cpu_s / self.records * 1e6 if self.records else 0.0

    @property
    def speedup(self) -> float | None:
        return self.one_process_s / self.seconds if self.one_process_s else None


def best_of(repeat: int, fn: Any) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return min(times), result


def _cpu_s() -> float:
    """CPU seconds (user + system) of this process and its waited-for children."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _timed_export(path: Path, out: Path, repeat: int, workers: int | None) -> tuple[Any, float]:
    """The fastest of `repeat` exports (its report) and the CPU seconds it took."""
    from audit.export import export_parquet

    best: tuple[Any, float] | None = None
    for _ in range(repeat):
        cpu = _cpu_s()
        report = export_parquet([str(path)], out, overwrite=True, workers=workers)
        cpu = _cpu_s() - cpu
        if best is None or report.seconds < best[0].seconds:
            best = (report, cpu)
    assert best is not None
    return best


def exported(
    path: Path, root: Path, size: int, *, one_process: bool, repeat: int = 1
) -> tuple[Path, ExportRow]:
    """The log's Parquet export (written by this run, timed: the best of `repeat`), and
    the one-process export's time on the same log when `one_process`."""
    out = root / f"pq-{size}"
    # Every timing reads the log from the page cache (the plain passes after it do): read
    # it once first, or the export alone would pay the disk.
    with open(log_info(path).path, "rb") as f:
        while f.read(1 << 24):
            pass
    single = single_cpu = None
    if one_process:
        one, single_cpu = _timed_export(path, out, repeat, 1)
        single = one.seconds
    report, cpu = _timed_export(path, out, repeat, None)
    megabytes = sum(f.stat().st_size for f in out.rglob("*.parquet")) / 1e6
    return out, ExportRow(
        report.records, report.seconds, single, report.workers, megabytes, cpu, single_cpu
    )


def _same(job: str, spark_res: Any, plain_res: Any) -> None:
    """The Spark job and the plain pass must agree (all but the first summary line, which
    names the input)."""
    if spark_res.summary[1:] != plain_res.summary[1:] or spark_res.stats != plain_res.stats:
        raise SystemExit(
            f"answers differ for {job}:\n  spark: {spark_res.summary}\n  plain: {plain_res.summary}"
        )


def _answer(job: str, res: Any) -> str:
    s = res.stats
    return {
        "elections": lambda: f"{s['elections']:,} elections",
        "unclean-recoveries": lambda: f"{s['recoveries']:,} recoveries",
        "offline": lambda: f"{s['intervals']:,} offline intervals",
        "brokers": lambda: f"{s['fences']:,} fences",
        "invariants": lambda: f"{s['violations']} violations / {s['records']:,} events",
    }[job]()


def measure(
    spark: Any,
    path: Path,
    pq: Path,
    size: int,
    *,
    repeat: int,
    sources: tuple[str, ...],
    jobs: tuple[str, ...] = JOBS,
) -> list[Row]:
    """Each job: the plain pass over the SQLite log, Spark from each source."""
    import importlib

    from audit import plain
    from audit.jobs import MODULES
    from audit.spark import AuditInput

    records = log_info(path).end_offset
    rows = []
    for job in jobs:
        p_time, p_run = best_of(repeat, lambda job=job: plain.run_jobs([str(path)], [job]))
        expected = p_run.results[job]
        module = importlib.import_module(MODULES[job])
        for source in sources:
            if source == "parquet":
                inp = AuditInput.of(parquet=str(pq))
            else:
                inp = AuditInput.of(str(path))
            inp.aborted(spark)  # per input, once (what `audit all` shares between jobs)
            s_time, s_res = best_of(repeat, lambda m=module, i=inp: m.run(spark, i))
            _same(job, s_res, expected)
            rows.append(Row(size, records, job, source, s_time, p_time, _answer(job, s_res)))
            print(
                f"  {job} from {source}: Spark {s_time:.1f} s, plain {p_time:.1f} s",
                file=sys.stderr,
                flush=True,
            )
    return rows


def print_table(rows: list[Row], exports: dict[int, ExportRow], master: str) -> None:
    print()
    print(f"Spark ({master}, warm session) vs one plain Python process (from the SQLite log)")
    head = (
        f"{'records':>12}  {'job':<19} {'source':<8} {'spark s':>8} {'plain s':>8} "
        f"{'speed-up':>8} {'growth':>11}  answer"
    )
    print(head)
    print("-" * len(head))
    first: dict[tuple[str, str], Row] = {}
    for r in rows:
        base = first.setdefault((r.job, r.source), r)
        growth = (
            f"x{r.spark_s / base.spark_s:.1f}/x{r.records / base.records:.0f}"
            if r is not base
            else "-"
        )
        print(
            f"{r.records:>12,}  {r.job:<19} {r.source:<8} {r.spark_s:>8.1f} {r.plain_s:>8.1f} "
            f"{r.speedup:>7.2f}x {growth:>11}  {r.answer}"
        )
    print()
    print("speed-up: plain time / Spark time (> 1: Spark is faster). growth: Spark time and")
    print("record count relative to the smallest size (linear: the two numbers match).")
    print_exports(exports)


def print_exports(exports: dict[int, ExportRow]) -> None:
    for _size, e in sorted(exports.items()):
        single = (
            f"; one process {e.one_process_s:.1f} s ({e.records / e.one_process_s:,.0f} "
            f"records/s, {e.one_process_cpu_s / e.records * 1e6:.2f} µs of CPU per record, "
            f"{e.speedup:.2f}x)"
            if e.one_process_s and e.one_process_cpu_s is not None
            else ""
        )
        print(
            f"log export {e.records:,} records: {e.seconds:.1f} s, {e.rate:,.0f} records/s on "
            f"{e.workers} processes, {e.cpu_us:.2f} µs of CPU per record, "
            f"{e.megabytes:.0f} MB{single}"
        )


def print_json(rows: list[Row], exports: dict[int, ExportRow], master: str) -> None:
    for r in rows:
        print(
            json.dumps(
                {
                    "job": r.job,
                    "source": r.source,
                    "records": r.records,
                    "speedup": round(r.speedup, 3),
                    "spark_s": round(r.spark_s, 3),
                    "plain_s": round(r.plain_s, 3),
                    "master": master,
                    "answer": r.answer,
                }
            )
        )
    for e in exports.values():
        print(
            json.dumps(
                {
                    "job": "log-export",
                    "source": "sqlite",
                    "records": e.records,
                    "speedup": None if e.speedup is None else round(e.speedup, 3),
                    "seconds": round(e.seconds, 3),
                    "records_per_s": round(e.rate),
                    "one_process_s": None if e.one_process_s is None else round(e.one_process_s, 3),
                    "workers": e.workers,
                    "cpu_s": round(e.cpu_s, 3),
                    "cpu_us_per_record": round(e.cpu_us, 3),
                    "megabytes": round(e.megabytes, 1),
                }
            )
        )


# --- the command as a user runs it (issue 13) ------------------------------------------------

CLI_RECORDS = 30_000
_TIMES = re.compile(r"\((\d+\.\d+) s on \S+, of which (\d+\.\d+) s starting Spark\)")


def small_log(root: Path) -> Path:
    """A simulated history of about 30k records (30 brokers, 5000 partitions, ~7 h)."""
    cfg = HistoryConfig(brokers=30, partitions=5000, days=0.29, seed=13)
    return _simulated(root, "cli-30k", cfg)


@dataclass
class CliRun:
    variant: str
    wall_s: float
    command_s: float
    start_s: float


def cli_once(path: Path, master: str, cache: Path, cds_on: bool, variant: str) -> CliRun:
    """`metactl audit elections` in a fresh process, as typed: the wall time around it,
    the command's own total, and Spark's start-up within it (from its last line)."""
    import subprocess

    from audit import cds

    env = dict(os.environ, **{cds.ENV_DIR: str(cache), cds.ENV_SWITCH: "on" if cds_on else "off"})
    cmd = [sys.executable, "-m", "ops.cli", "audit", "elections", "--data-dir", str(path)]
    started = time.perf_counter()
    done = subprocess.run(
        [*cmd, "--master", master], capture_output=True, text=True, env=env, check=True
    )
    wall = time.perf_counter() - started
    found = _TIMES.search(done.stdout)
    if found is None:
        raise SystemExit(f"no timing line in: {done.stdout[-300:]}")
    return CliRun(variant, wall, float(found[1]), float(found[2]))


def _await_archive(cache: Path, bound_s: float = 120.0) -> None:
    """The first run's JVM writes the archive after the command returned: wait until
    `cds.promote_finished` (as the next launch would) turns its part into the archive."""
    from audit import cds

    key = cds.archive_key()
    if key is None:
        raise SystemExit("no Java installation found: no CDS archive to wait for")
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        cds.promote_finished(cache, key)
        if cds.archive_path(cache, key).is_file():
            return
        time.sleep(0.5)
    raise SystemExit("the CDS archive was not written in time")


def cli_bench(root: Path, master: str, repeat: int) -> None:
    import tempfile

    path = small_log(root)
    records = log_info(path).end_offset
    runs: list[CliRun] = []
    with tempfile.TemporaryDirectory(prefix="metactl-cds-") as tmp:
        cache = Path(tmp)
        runs.append(cli_once(path, master, cache, True, "first run (writes the CDS archive)"))
        _await_archive(cache)
        for _ in range(repeat):
            runs.append(cli_once(path, master, cache, True, "CDS archive mapped"))
            runs.append(cli_once(path, master, cache, False, "CDS off"))
    print()
    print(f"metactl audit elections on {records:,} records ({master}), one process per run")
    head = f"{'variant':<36} {'wall s':>7} {'command s':>10} {'Spark start s':>14} {'jobs s':>7}"
    print(head)
    print("-" * len(head))
    for r in runs:
        print(
            f"{r.variant:<36} {r.wall_s:>7.1f} {r.command_s:>10.1f} {r.start_s:>14.1f} "
            f"{r.command_s - r.start_s:>7.1f}"
        )
    for variant in ("CDS archive mapped", "CDS off"):
        walls = sorted(r.wall_s for r in runs if r.variant == variant)
        starts = sorted(r.start_s for r in runs if r.variant == variant)
        print(
            f"{variant}: median wall {walls[len(walls) // 2]:.1f} s "
            f"(Spark start {starts[len(starts) // 2]:.1f} s), best {walls[0]:.1f} s; goal 15 s"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1M,10M", help="comma-separated, e.g. 200k,1M,10M")
    parser.add_argument(
        "--master", help="default local[2]; with --cli local[*], the audit command's default"
    )
    parser.add_argument("--dir", type=Path, default=Path("bench/out/spark-audit"))
    parser.add_argument(
        "--repeat",
        type=int,
        help="best of N runs (default 1); with --cli, N runs of each variant (default 3)",
    )
    parser.add_argument(
        "--sources",
        default="parquet,sqlite",
        help="Spark's inputs to time: parquet (the export), sqlite (the data source)",
    )
    parser.add_argument("--jobs", default=",".join(JOBS), help="comma-separated jobs to time")
    parser.add_argument(
        "--one-process-export",
        action="store_true",
        help="also time the export in one process (its speed-up over it; ~2 s per 1M records)",
    )
    parser.add_argument(
        "--only-export",
        action="store_true",
        help="time `log export` alone (records/s, CPU per record): no Spark, no jobs",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per line (job, source, records, speedup, ...) instead of the table",
    )
    parser.add_argument(
        "--cli",
        action="store_true",
        help=f"instead: `metactl audit elections` on ~{CLI_RECORDS // 1000}k records as a "
        "command (wall time beside Spark's start-up), with and without the CDS archive",
    )
    args = parser.parse_args(argv)
    if args.repeat is not None and args.repeat < 1:
        parser.error("--repeat must be at least 1")
    sources = tuple(s.strip() for s in args.sources.split(",") if s.strip())
    jobs = tuple(j.strip() for j in args.jobs.split(",") if j.strip())
    if not set(sources) <= {"parquet", "sqlite"} or not sources:
        parser.error("--sources takes parquet and/or sqlite")
    if not set(jobs) <= set(JOBS) or not jobs:
        parser.error(f"--jobs takes some of {', '.join(JOBS)}")
    configure(json=False, level=logging.WARNING)
    if args.cli:
        args.dir.mkdir(parents=True, exist_ok=True)
        cli_bench(args.dir, args.master or "local[*]", args.repeat or 3)
        return 0
    master, repeat = args.master or "local[2]", args.repeat or 1
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    args.dir.mkdir(parents=True, exist_ok=True)
    logs = {size: sized_log(args.dir, size) for size in sizes}
    exports: dict[int, ExportRow] = {}
    parquet: dict[int, Path] = {}
    for size in sizes:
        parquet[size], exports[size] = exported(
            logs[size],
            args.dir,
            size,
            one_process=args.one_process_export,
            repeat=repeat if args.only_export else 1,
        )
        e = exports[size]
        print(
            f"exported {e.records:,} records in {e.seconds:.1f} s ({e.rate:,.0f} records/s)",
            file=sys.stderr,
            flush=True,
        )
    if args.only_export:
        if args.json:
            print_json([], exports, master)
        else:
            print_exports(exports)
        return 0

    from audit.jobs import unclean
    from audit.spark import AuditInput, get_session

    started = time.perf_counter()
    spark = get_session(master, app_name="metactl-bench", shuffle_partitions=8)
    # A warm session: the JVM's code and the Python workers' imports (the data source's,
    # the bucket tasks') are loaded by a first run of every job on the base history.
    import importlib

    from audit.export import export_parquet
    from audit.jobs import MODULES

    base = base_log(args.dir)
    warm_pq = args.dir / "pq-base"
    export_parquet([str(base)], warm_pq, overwrite=True)
    unclean.run(spark, AuditInput.of(str(base)))
    for job in jobs:
        importlib.import_module(MODULES[job]).run(spark, AuditInput.of(parquet=str(warm_pq)))
    print(
        f"Spark session up and warm in {time.perf_counter() - started:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    rows: list[Row] = []
    for size in sizes:
        rows.extend(
            measure(
                spark, logs[size], parquet[size], size, repeat=repeat, sources=sources, jobs=jobs
            )
        )
    spark.stop()
    if args.json:
        print_json(rows, exports, master)
    else:
        print_table(rows, exports, master)
    return 0


if __name__ == "__main__":
    sys.exit(main())
