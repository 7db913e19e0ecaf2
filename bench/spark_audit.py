"""Benchmark of the Spark audits against a plain single-process pass over the same logs.

Run ``python bench/spark_audit.py [--sizes 1M,10M] [--master local[2]]``. For each size it
times, in the same run and on the same log:

* ``unclean-recoveries`` and ``invariants`` on Spark (warm session, results collected);
* the plain pass (`audit.plain`): stdlib SQLite, msgspec ``decode_batch`` of every batch,
  and plain Python for the same answers (the same invariant checker);

and prints records/s, the speed-up of Spark over the plain pass, and how each cost grew
from the smallest size (linear growth means that ratio follows the size ratio). The
answers of both are compared; a mismatch fails the run.

``python bench/spark_audit.py --cli [--repeat N]`` measures instead what an operator waits
for (issue 13): ``metactl audit elections`` on a ~30k-record log, one fresh process per
run, its wall time beside Spark's start-up time, with the class-data sharing archive
(`audit.cds`, in a temporary cache) and without it.

Logs: a base history is simulated once (``metactl simulate history``: 30 brokers, 5000
partitions, days enough for ~1M records), then larger logs are *tiled* from it: copy k of
the base is appended with its broker ids, topic names, broker epochs and timestamps
shifted, so the big log is k independent, healthy sub-clusters one after another (a
faster synthetic writer than simulating 10M records). Logs are kept under ``--dir``
(default ``bench/out/spark-audit``) and reused by later runs.

Design note (measured while building the jobs, 2.7M records, 2 cores): the invariants
check through Spark rows (shuffle by partition, sort, ``mapInArrow``) took ~45 s against
~5 s for the plain pass; the per-record cost of building Arrow rows in Python, moving
them through the JVM and back exceeds the check itself. So on data directories the job
splits partitions into one bucket per core and each task reads the log itself
(``--method logs``); the rows path serves Parquet input. This script measures; it must
not be imported by the product.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from audit import plain
from audit.logread import iter_batches, log_info
from metactl.logs import configure
from metadata_log.records import (
    BrokerRegistrationChangeRecord,
    ClearElrRecord,
    FenceBrokerRecord,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RecoveryCandidate,
    RegisterBrokerRecord,
    TopicRecord,
    UncleanRecoveryRecord,
    UnfenceBrokerRecord,
    decode_batch,
)
from metadata_log.sqlite_format import LOG_FILE_NAME
from metadata_log.sqlite_store import SqliteLogStore
from simulation.history import simulate_history
from simulation.history_config import DAY_MS, HistoryConfig

BASE_DAYS = 12.0  # 30 brokers / 5000 partitions make ~90k records a day
BROKER_STRIDE = 1000


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


def _shift(r: MetadataRecord, k: int, shift: int) -> MetadataRecord:
    """Copy k of a record: brokers + k*STRIDE, topics prefixed, broker epochs + shift."""
    if k == 0:
        return r
    db = k * BROKER_STRIDE
    rep = msgspec.structs.replace

    def topic(name: str) -> str:
        return f"c{k}-{name}"

    def brokers(ids: list[int] | None) -> list[int] | None:
        return None if ids is None else [b + db for b in ids]

    match r:
        case PartitionChangeRecord():
            return rep(
                r,
                topic=topic(r.topic),
                leader=r.leader if r.leader is None or r.leader < 0 else r.leader + db,
                isr=brokers(r.isr),
                elr=brokers(r.elr),
                last_known_elr=brokers(r.last_known_elr),
                broker=None if r.broker is None else r.broker + db,
            )
        case PartitionRecord():
            return rep(
                r,
                topic=topic(r.topic),
                replicas=[b + db for b in r.replicas],
                isr=[b + db for b in r.isr],
                elr=[b + db for b in r.elr],
                last_known_elr=[b + db for b in r.last_known_elr],
                leader=r.leader + db if r.leader >= 0 else r.leader,
            )
        case RegisterBrokerRecord():
            return rep(
                r,
                broker_id=r.broker_id + db,
                incarnation_id=f"c{k}-{r.incarnation_id}",
                broker_epoch=r.broker_epoch + shift,
                previous_epoch=None if r.previous_epoch is None else r.previous_epoch + shift,
            )
        case FenceBrokerRecord() | UnfenceBrokerRecord() | BrokerRegistrationChangeRecord():
            return rep(r, broker_id=r.broker_id + db, broker_epoch=r.broker_epoch + shift)
        case UncleanRecoveryRecord():
            return rep(
                r,
                topic=topic(r.topic),
                chosen=r.chosen + db,
                candidates=[
                    RecoveryCandidate(
                        broker_id=c.broker_id + db,
                        last_leader_epoch=c.last_leader_epoch,
                        log_end_offset=c.log_end_offset,
                        broker_epoch=c.broker_epoch + shift,
                    )
                    for c in r.candidates
                ],
            )
        case TopicRecord():
            return rep(r, name=topic(r.name), topic_id=f"c{k}-{r.topic_id}")
        case ClearElrRecord():
            return rep(r, topic=topic(r.topic))
    return r


async def _tile(base: Path, out: Path, target: int) -> int:
    info = log_info(base)
    first, last = _time_span(base)
    period = last - first + DAY_MS
    store = await SqliteLogStore.open(out)
    written = 0
    try:
        k = 0
        while written < target:
            shift = written
            pending = []
            for chunk in iter_batches(info.path, info.start_offset, info.end_offset):
                for _base, count, ts, payload in chunk:
                    if written >= target:
                        break
                    records = [_shift(r, k, shift) for r in decode_batch(payload)]
                    pending.append(store.append(records, timestamp_ms=ts + k * period))
                    written += count
                    if len(pending) >= 2000:
                        await asyncio.gather(*pending)
                        pending = []
            if pending:
                await asyncio.gather(*pending)
            k += 1
    finally:
        await store.close()
    return written


def _time_span(path: Path) -> tuple[int, int]:
    from audit.logread import log_time_bounds

    lo, hi = log_time_bounds(log_info(path).path)
    assert lo is not None and hi is not None
    return lo, hi


def sized_log(root: Path, size: int) -> Path:
    base = base_log(root)
    path = root / f"tiled-{size}"
    if not (path / LOG_FILE_NAME).exists():
        shutil.rmtree(path, ignore_errors=True)
        started = time.perf_counter()
        n = asyncio.run(_tile(base, path, size))
        dt = time.perf_counter() - started
        print(f"tiled {n:,} records into {path} in {dt:.1f} s ({n / dt:,.0f} records/s)")
    return path


# --- measuring ----------------------------------------------------------------------------


@dataclass
class Row:
    size: int
    records: int
    job: str
    spark_s: float
    plain_s: float
    answer: str

    @property
    def speedup(self) -> float:
        return self.plain_s / self.spark_s if self.spark_s else 0.0


def measure(spark: Any, path: Path, size: int, repeat: int) -> list[Row]:
    from audit.jobs import invariants, unclean
    from audit.spark import AuditInput

    records = log_info(path).end_offset
    inp = AuditInput.of(str(path))
    rows = []

    def best(fn: Any) -> tuple[float, Any]:
        times, result = [], None
        for _ in range(repeat):
            t = time.perf_counter()
            result = fn()
            times.append(time.perf_counter() - t)
        return min(times), result

    s_time, s_res = best(lambda: unclean.run(spark, inp))
    p_time, p_res = best(lambda: plain.run(path, invariants=False))
    if s_res.stats["recoveries"] != len(p_res.recoveries):
        raise SystemExit(f"answers differ: {s_res.stats['recoveries']} vs {len(p_res.recoveries)}")
    rows.append(
        Row(
            size,
            records,
            "unclean-recoveries",
            s_time,
            p_time,
            f"{len(p_res.recoveries):,} recoveries",
        )
    )
    s_time, s_res = best(lambda: invariants.run(spark, inp))
    p_time, p_res = best(lambda: plain.run(path, recoveries=False))
    if (
        s_res.stats["violations"] != len(p_res.violations)
        or s_res.stats["records"] != p_res.checked
    ):
        raise SystemExit(f"answers differ: {s_res.stats} vs {len(p_res.violations)} violations")
    rows.append(
        Row(
            size,
            records,
            "invariants",
            s_time,
            p_time,
            f"{len(p_res.violations)} violations / {p_res.checked:,} events",
        )
    )
    return rows


def print_table(rows: list[Row], master: str) -> None:
    print()
    print(f"Spark ({master}, warm session) vs one plain Python process, same log, same run")
    head = (
        f"{'records':>12}  {'job':<19} {'spark s':>8} {'spark rec/s':>12} "
        f"{'plain s':>8} {'plain rec/s':>12} {'speed-up':>8} {'growth':>12}  answer"
    )
    print(head)
    print("-" * len(head))
    first: dict[str, Row] = {}
    for r in rows:
        base = first.setdefault(r.job, r)
        growth = (
            f"x{r.spark_s / base.spark_s:.1f}/x{r.records / base.records:.0f}"
            if r is not base
            else "-"
        )
        print(
            f"{r.records:>12,}  {r.job:<19} {r.spark_s:>8.1f} {r.records / r.spark_s:>12,.0f} "
            f"{r.plain_s:>8.1f} {r.records / r.plain_s:>12,.0f} {r.speedup:>7.2f}x "
            f"{growth:>12}  {r.answer}"
        )
    print()
    print("speed-up: plain time / Spark time (> 1: Spark is faster). growth: Spark time and")
    print("record count relative to the smallest size (linear: the two numbers match).")


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
        "--cli",
        action="store_true",
        help=f"instead: `metactl audit elections` on ~{CLI_RECORDS // 1000}k records as a "
        "command (wall time beside Spark's start-up), with and without the CDS archive",
    )
    args = parser.parse_args(argv)
    if args.repeat is not None and args.repeat < 1:
        parser.error("--repeat must be at least 1")
    configure(json=False, level=logging.WARNING)
    if args.cli:
        args.dir.mkdir(parents=True, exist_ok=True)
        cli_bench(args.dir, args.master or "local[*]", args.repeat or 3)
        return 0
    master, repeat = args.master or "local[2]", args.repeat or 1
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    args.dir.mkdir(parents=True, exist_ok=True)
    logs = {size: sized_log(args.dir, size) for size in sizes}

    from audit.jobs import unclean
    from audit.spark import AuditInput, get_session

    started = time.perf_counter()
    spark = get_session(master, app_name="metactl-bench", shuffle_partitions=8)
    unclean.run(spark, AuditInput.of(str(base_log(args.dir))))  # warm the Python workers
    print(f"Spark session up and warm in {time.perf_counter() - started:.1f} s")
    rows: list[Row] = []
    for size in sizes:
        rows.extend(measure(spark, logs[size], size, repeat))
        print_table(rows, master)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
