"""Crash safety: every acknowledged append survives a SIGKILL in the middle of appending."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from metadata_log.sqlite_store import SqliteLogStore
from tests.metadata_log.log_fixtures import HERE, LineReader, crash_batch

ACKS_BEFORE_KILL = 400


def run_writer_until_acks(data_dir: Path, wanted: int, stderr_path: Path) -> dict[int, range]:
    """Start the writer, read acknowledgements until `wanted`, then SIGKILL it."""
    acks: dict[int, range] = {}
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "crash_writer.py"), str(data_dir)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        try:
            assert proc.stdout is not None
            lines = LineReader(proc.stdout, "the crash writer")
            assert lines.next() == "ready", stderr_path.read_text()
            while len(acks) < wanted:
                number, start, stop = map(int, lines.next().split())
                acks[number] = range(start, stop)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return acks


@pytest.mark.slow
def test_acknowledged_records_survive_sigkill(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    acks = run_writer_until_acks(data_dir, ACKS_BEFORE_KILL, tmp_path / "stderr.txt")
    # The acknowledged ranges are disjoint and each holds its whole batch.
    assert sum(len(r) for r in acks.values()) == len({o for r in acks.values() for o in r})

    async def check() -> None:
        async with await SqliteLogStore.open(data_dir) as store:
            assert store.end_offset >= max(r.stop for r in acks.values())
            for number, offsets in sorted(acks.items()):
                entries = await store.read(offsets.start, max_records=len(offsets))
                assert [e.offset for e in entries] == list(offsets)
                assert [e.record for e in entries] == crash_batch(number), number
            report = await store.verify()
            assert report.records == store.end_offset
            # The log keeps going after the crash.
            after = await store.append(crash_batch(0))
            assert after.start == report.end_offset

    asyncio.run(check())
