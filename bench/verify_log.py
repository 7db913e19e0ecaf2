"""Benchmark of `controller serve --verify-log`: what opening the log costs with the tail
check (the default) and with the full check, and how fast a damaged log ends the process.

Run ``python bench/verify_log.py [--batches N] [--records-per-batch R]``. It writes a log
of N batches (R ~100-byte partition changes each, distinct timestamps) under a temporary
directory, then prints:

- the time of `SqliteLogStore.open` (tail check) and of `open(verify_all=True)`, the
  median of 5, and their ratio;
- the wall time from spawning `python -m controller` on a copy whose 4th batch is damaged
  to its exit (status 1), with each `--verify-log`, the median of 3 (Python start-up
  included).

This script measures; it must not be imported by the product.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from metactl.logs import configure
from metadata_log.records import ChangeReason, MetadataRecord, PartitionChangeRecord
from metadata_log.sqlite_format import LOG_FILE_NAME
from metadata_log.sqlite_store import SqliteLogStore

REPO = Path(__file__).resolve().parents[1]


def record(i: int) -> MetadataRecord:
    return PartitionChangeRecord(
        topic=f"orders-{i % 50:03d}",
        partition=i % 64,
        reason=ChangeReason.ALTER_PARTITION,
        partition_epoch=1000 + i,
        leader_epoch=10 + i // 64,
        isr=[1 + i % 5, 1 + (i + 1) % 5, 1 + (i + 2) % 5],
        broker=1 + i % 5,
    )


async def write(data_dir: Path, batches: int, per_batch: int) -> None:
    async with await SqliteLogStore.open(data_dir) as store:
        n = 0
        for b in range(batches):
            await store.append([record(n + i) for i in range(per_batch)], timestamp_ms=1000 + b)
            n += per_batch


async def time_open(data_dir: Path, *, verify_all: bool) -> float:
    started = time.perf_counter()
    store = await SqliteLogStore.open(data_dir, verify_all=verify_all)
    elapsed = time.perf_counter() - started
    await store.close()
    return elapsed


def damage(path: Path, base_offset: int) -> None:
    with sqlite3.connect(path) as conn:
        (payload,) = conn.execute(
            "SELECT payload FROM batches WHERE base_offset = ?", (base_offset,)
        ).fetchone()
        bad = bytearray(payload)
        bad[len(bad) // 2] ^= 1
        conn.execute(
            "UPDATE batches SET payload = ? WHERE base_offset = ?", (bytes(bad), base_offset)
        )


def time_failed_start(data_dir: Path, mode: str) -> float:
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "controller", "--data-dir", str(data_dir), "--listen",
         "127.0.0.1:0", "--insecure", "--verify-log", mode],
        capture_output=True, text=True, cwd=REPO, timeout=600, check=False,
    )  # fmt: skip
    elapsed = time.perf_counter() - started
    assert proc.returncode == 1 and "CORRUPT_MESSAGE" in proc.stderr, proc.stderr
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, default=20_000)
    p.add_argument("--records-per-batch", type=int, default=50)
    args = p.parse_args()
    configure(json=False, level=logging.WARNING)
    tmp = Path(tempfile.mkdtemp(prefix="metactl-verify-bench-"))
    try:
        log_dir = tmp / "log"
        asyncio.run(write(log_dir, args.batches, args.records_per_batch))
        size = (log_dir / LOG_FILE_NAME).stat().st_size
        records = args.batches * args.records_per_batch
        tail = statistics.median(
            asyncio.run(time_open(log_dir, verify_all=False)) for _ in range(5)
        )
        full = statistics.median(asyncio.run(time_open(log_dir, verify_all=True)) for _ in range(5))
        print(f"log: {args.batches:,} batches, {records:,} records, {size / 2**20:.1f} MiB")
        print(f"open, --verify-log tail: {tail * 1000:8.1f} ms")
        print(
            f"open, --verify-log full: {full * 1000:8.1f} ms  ({records / full:,.0f} records/s, "
            f"{full / tail:.0f}x tail)"
        )
        damaged = tmp / "damaged"
        shutil.copytree(log_dir, damaged)
        damage(damaged / LOG_FILE_NAME, 3 * args.records_per_batch)
        for mode in ("tail", "full"):
            t = statistics.median(time_failed_start(damaged, mode) for _ in range(3))
            print(f"damaged 4th batch, --verify-log {mode}: exit 1 after {t:.2f} s (spawn to exit)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
