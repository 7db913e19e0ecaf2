"""Benchmark of the durable metadata log (SQLite backend): appends, replay, tail latency.

Run ``python bench/log_append.py [--records N] [--big]``. It prints one results table with
the goal next to each measured number, and the machine's load average: on a shared machine
other work lowers the wall-clock rates (replay also shows its rate per CPU second).
Everything is written under a temporary directory (or ``--dir``) that is removed
afterwards. This script measures; it must not be imported by the product.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import random
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from metactl.logs import configure
from metadata_log.records import (
    ChangeReason,
    MetadataRecord,
    PartitionChangeRecord,
    encode_batch,
    encode_record,
)
from metadata_log.sqlite_format import FOLLOWER_POLL_INTERVAL, LOG_FILE_NAME
from metadata_log.sqlite_store import SqliteLogStore


def make_record(i: int) -> MetadataRecord:
    """A realistic ~100-byte partition change (an ISR shrink/expand)."""
    return PartitionChangeRecord(
        topic=f"orders-{i % 50:03d}",
        partition=i % 64,
        reason=ChangeReason.ALTER_PARTITION,
        partition_epoch=1000 + i,
        leader_epoch=10 + i // 64,
        isr=[1 + i % 5, 1 + (i + 1) % 5, 1 + (i + 2) % 5],
        broker=1 + i % 5,
    )


def make_records(n: int, first: int = 0) -> list[MetadataRecord]:
    return [make_record(first + i) for i in range(n)]


def chunks(records: list[MetadataRecord], size: int) -> Iterator[list[MetadataRecord]]:
    for i in range(0, len(records), size):
        yield records[i : i + size]


@dataclass
class Row:
    name: str
    goal: str
    measured: str
    verdict: str = ""


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def fmt_rate(value: float) -> str:
    return f"{value:,.0f} rec/s"


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- the store -----------------------------------------------------------------------------


async def bench_sequential(
    store: SqliteLogStore, records: list[MetadataRecord], size: int
) -> float:
    start = time.perf_counter()
    for batch in chunks(records, size):
        await store.append(batch)
    return rate(len(records), time.perf_counter() - start)


async def bench_concurrent(
    store: SqliteLogStore, records: list[MetadataRecord], tasks: int, size: int
) -> tuple[float, float]:
    """`tasks` appenders share `records`, each appending `size` at a time."""
    batches = list(chunks(records, size))
    commits_before = store.commits

    async def appender(k: int) -> None:
        for batch in batches[k::tasks]:
            await store.append(batch)

    start = time.perf_counter()
    await asyncio.gather(*(appender(k) for k in range(tasks)))
    elapsed = time.perf_counter() - start
    commits = store.commits - commits_before
    return rate(len(records), elapsed), len(records) / max(commits, 1)


async def bench_tail_latency(
    store: SqliteLogStore, samples: int
) -> tuple[list[float], list[float]]:
    """Commit→woken and append-call→woken latencies (µs) of an in-process `wait_for`."""
    commit_to_wake: list[float] = []
    append_to_wake: list[float] = []
    append_started: list[int] = []
    first = store.end_offset

    async def waiter() -> None:
        for i in range(samples):
            await store.wait_for(first + i)
            woke = time.perf_counter_ns()
            commit_to_wake.append((woke - store.last_commit_ns) / 1000)
            append_to_wake.append((woke - append_started[i]) / 1000)

    task = asyncio.create_task(waiter())
    for i in range(samples):
        append_started.append(time.perf_counter_ns())
        await store.append([make_record(i)])
    await task
    return commit_to_wake, append_to_wake


async def bench_follower_latency(store: SqliteLogStore, path: Path, samples: int) -> list[float]:
    """Commit→woken latency (ms) of a read-only follower, which polls.

    Commits land at a random phase of the follower's poll cycle, as they would in real use.
    """
    follower = await SqliteLogStore.open(path, read_only=True)
    latencies: list[float] = []
    phase = random.Random(966)
    try:
        for i in range(samples):
            offset = store.end_offset
            waiting = asyncio.create_task(follower.wait_for(offset, timeout=5))
            await asyncio.sleep(phase.uniform(0, FOLLOWER_POLL_INTERVAL))
            await store.append([make_record(i)])
            committed = store.last_commit_ns
            await waiting
            latencies.append((time.perf_counter_ns() - committed) / 1e6)
    finally:
        await follower.close()
    return latencies


async def bench_replay(path: Path) -> tuple[float, float, int]:
    """One pass of replay + decode over the whole log: records per wall-clock second and
    per CPU second of this process (SQLite steps on a thread of its own; both count).

    On a shared machine the wall rate falls with the CPU this process is given (two busy
    processes on a two-CPU machine cut it by up to half) while the CPU rate hardly moves:
    a low wall rate with a steady CPU rate is a busy machine, not slower code."""
    store = await SqliteLogStore.open(path, read_only=True)
    try:
        count = 0
        cpu = time.process_time()
        start = time.perf_counter()
        async for _entry in store.iter_entries(store.start_offset):
            count += 1
        wall = time.perf_counter() - start
        return rate(count, wall), rate(count, time.process_time() - cpu), count
    finally:
        await store.close()


# --- raw sqlite3 baseline ----------------------------------------------------------------


def raw_connection(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


# The raw baselines get their bytes pre-encoded and commit everything in ONE transaction
# (one fsync); a sequential store append pays for its own encoding and fsync every time.
def bench_raw_rows(path: Path, records: list[MetadataRecord]) -> float:
    """One row per record, the same encoded bytes, one transaction, one executemany."""
    payloads = [encode_record(r) for r in records]
    rows = [(i, 0, zlib.crc32(p), p) for i, p in enumerate(payloads)]
    conn = raw_connection(path)
    conn.execute("CREATE TABLE records (o INTEGER PRIMARY KEY, ts, crc, payload BLOB)")
    start = time.perf_counter()
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO records VALUES (?, ?, ?, ?)", rows)
    conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return rate(len(records), elapsed)


def bench_raw_batches(path: Path, records: list[MetadataRecord], size: int) -> float:
    """The store's own layout (a row per pre-encoded batch) written raw: the upper bound."""
    rows = []
    for i, batch in enumerate(chunks(records, size)):
        payload = encode_batch(batch)
        rows.append(
            (i * size, i * size + len(batch) - 1, len(batch), 0, zlib.crc32(payload), payload)
        )
    conn = raw_connection(path)
    conn.execute("CREATE TABLE batches (b INTEGER PRIMARY KEY, l, n, ts, crc, payload BLOB)")
    start = time.perf_counter()
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?)", rows)
    conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return rate(len(records), elapsed)


# --- bounded-memory streaming --------------------------------------------------------------


async def build_log(path: Path, total: int, size: int = 1000) -> None:
    store = await SqliteLogStore.open(path)
    try:
        template = make_records(size)
        while store.end_offset < total:
            await store.append(template[: min(size, total - store.end_offset)])
    finally:
        await store.close()


def peak_rss_kb() -> int:
    """Peak RSS of this process in KiB.

    On Linux this is VmHWM: `ru_maxrss` also counts the parent's peak from before exec.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def stream_child(path: str) -> None:
    """Run in a fresh interpreter: iterate the whole log, report peak RSS before and after."""

    async def run() -> tuple[int, int, int, float]:
        store = await SqliteLogStore.open(path, read_only=True)
        try:
            gc.collect()
            before = peak_rss_kb()
            count = 0
            start = time.perf_counter()
            async for _entry in store.iter_entries(store.start_offset):
                count += 1
            elapsed = time.perf_counter() - start
            after = peak_rss_kb()
            return before, after, count, elapsed
        finally:
            await store.close()

    before, after, count, elapsed = asyncio.run(run())
    print(before, after, count, elapsed)


def bench_streaming(path: Path) -> tuple[int, int, int, float]:
    result = subprocess.run(
        [sys.executable, __file__, "--stream-child", str(path)],
        check=True,
        capture_output=True,
        text=True,
    )
    before, after, count, elapsed = result.stdout.split()
    return int(before), int(after), int(count), float(elapsed)


# --- main ----------------------------------------------------------------------------------


async def run(args: argparse.Namespace, root: Path) -> list[Row]:
    n = args.records
    records = make_records(n)
    size = len(encode_record(records[0]))
    print(f"records: {n:,} PartitionChangeRecords, ~{size} bytes each encoded", flush=True)
    rows: list[Row] = []
    log_dir = root / "store"
    store = await SqliteLogStore.open(log_dir)
    try:
        seq1 = await bench_sequential(store, records[: min(n, args.single)], 1)
        rows.append(Row("durable append, batch of 1, sequential", "-", fmt_rate(seq1)))

        batched = await bench_sequential(store, records, 1000)
        ok = batched >= 300_000
        rows.append(
            Row("durable append, batches of 1000", ">= 300,000 rec/s", fmt_rate(batched), _v(ok))
        )

        conc1, per_commit1 = await bench_concurrent(
            store, records[: min(n, args.single * 10)], 64, 1
        )
        rows.append(
            Row(
                "durable append, 64 tasks x batch of 1",
                "-",
                f"{fmt_rate(conc1)} ({per_commit1:.0f} rec/commit)",
            )
        )
        conc10, per_commit10 = await bench_concurrent(store, records, 64, 10)
        rows.append(
            Row(
                "durable append, 64 tasks x batch of 10",
                "-",
                f"{fmt_rate(conc10)} ({per_commit10:.0f} rec/commit)",
            )
        )

        conc1000, per_commit1000 = await bench_concurrent(store, records, 8, 1000)
        rows.append(
            Row(
                "durable append, 8 tasks x batches of 1000",
                "-",
                f"{fmt_rate(conc1000)} ({per_commit1000:.0f} rec/commit)",
            )
        )

        raw_rows = bench_raw_rows(root / "raw_rows.sqlite", records)
        raw_batches = bench_raw_batches(root / "raw_batches.sqlite", records, 1000)
        rows.append(Row("raw sqlite3 executemany, row per record", "-", fmt_rate(raw_rows)))
        rows.append(Row("raw sqlite3 executemany, row per batch", "-", fmt_rate(raw_batches)))
        ratio = batched / raw_rows
        rows.append(
            Row(
                "store (batches of 1000) / raw row per record",
                ">= 0.70x",
                f"{ratio:.2f}x",
                _v(ratio >= 0.7),
            )
        )
        rows.append(
            Row(
                "store (batches of 1000) / raw row per batch",
                "-",
                f"{batched / raw_batches:.2f}x sequential, {conc1000 / raw_batches:.2f}x 8 tasks",
            )
        )

        commit_to_wake, append_to_wake = await bench_tail_latency(store, args.latency_samples)
        rows.append(
            Row(
                "tail: commit -> in-process wait_for woken",
                "-",
                f"p50 {percentile(commit_to_wake, 0.5):.0f} µs, "
                f"p99 {percentile(commit_to_wake, 0.99):.0f} µs",
            )
        )
        rows.append(
            Row(
                "tail: append call -> in-process waiter woken",
                "-",
                f"p50 {percentile(append_to_wake, 0.5):.0f} µs, "
                f"p99 {percentile(append_to_wake, 0.99):.0f} µs",
            )
        )
        follower = await bench_follower_latency(store, log_dir, args.follower_samples)
        rows.append(
            Row(
                "tail: commit -> read-only follower woken",
                f"poll {FOLLOWER_POLL_INTERVAL * 1000:.0f} ms",
                f"p50 {statistics.median(follower):.1f} ms, "
                f"p99 {percentile(follower, 0.99):.1f} ms",
            )
        )
    finally:
        await store.close()

    passes = [await bench_replay(log_dir) for _ in range(args.replay_repeat)]
    replay = statistics.median(wall for wall, _cpu, _n in passes)
    per_cpu = statistics.median(cpu for _wall, cpu, _n in passes)
    replayed = passes[0][2]
    rows.append(
        Row(
            f"replay + decode ({replayed:,} records)",
            ">= 500,000 rec/s",
            f"{fmt_rate(replay)}, median of {len(passes)} ({per_cpu:,.0f} rec/CPU-s)",
            _v(replay >= 500_000),
        )
    )

    stream_dir = root / "stream"
    started = time.perf_counter()
    await build_log(stream_dir, args.stream_records)
    built = time.perf_counter() - started
    file_mb = (stream_dir / LOG_FILE_NAME).stat().st_size / 1e6
    before, after, count, elapsed = bench_streaming(stream_dir)
    rows.append(
        Row(
            f"build {count:,}-record log (batches of 1000)",
            "-",
            f"{fmt_rate(count / built)}, file {file_mb:,.0f} MB",
        )
    )
    growth_mb = (after - before) / 1024
    bounded = growth_mb < max(64.0, file_mb / 4)
    rows.append(
        Row(
            f"stream {count:,} records: peak RSS",
            "bounded (<< file)",
            f"{before / 1024:.0f} MB before, {after / 1024:.0f} MB after "
            f"(+{growth_mb:.0f} MB), {fmt_rate(count / elapsed)}",
            _v(bounded),
        )
    )
    return rows


def _v(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def print_table(rows: list[Row]) -> None:
    widths = [max(len(getattr(r, f)) for r in rows) for f in ("name", "goal", "measured")]
    header = ("metric", "goal", "measured")
    widths = [max(w, len(h)) for w, h in zip(widths, header, strict=True)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + "  result"
    print()
    print(line)
    print("-" * len(line))
    for r in rows:
        cells = (r.name, r.goal, r.measured)
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + "  " + r.verdict)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000, help="records per phase")
    parser.add_argument("--single", type=int, default=2_000, help="appends of one record")
    parser.add_argument("--latency-samples", type=int, default=1_000)
    parser.add_argument("--follower-samples", type=int, default=20)
    parser.add_argument("--stream-records", type=int, default=1_000_000)
    parser.add_argument("--big", action="store_true", help="stream a 10,000,000-record log")
    parser.add_argument(
        "--replay-repeat", type=int, default=3, help="replay passes (the median is shown)"
    )
    parser.add_argument("--dir", type=Path, help="work directory (default: a temp dir)")
    parser.add_argument("--stream-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replay_repeat < 1:
        parser.error("--replay-repeat must be at least 1")
    configure(json=False, level=logging.WARNING)
    if args.stream_child:
        stream_child(args.stream_child)
        return 0
    if args.big:
        args.stream_records = 10_000_000
    root = Path(tempfile.mkdtemp(prefix="metactl-bench-", dir=args.dir))
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    try:
        rows = asyncio.run(run(args, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_table(rows)
    print(
        f"\nsqlite {sqlite3.sqlite_version}, python {sys.version.split()[0]}, "
        f"{os.cpu_count()} cpus, total {time.perf_counter() - started:.1f} s, "
        f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    return 1 if any(r.verdict == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
