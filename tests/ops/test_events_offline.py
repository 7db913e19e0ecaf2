"""`metactl events --data-dir` on a real SQLite log whose records before a snapshot were
deleted: the lines after it are told against the snapshot's image (the leader and ISR a
fence took away), and a log that starts past 0 with no snapshot is the named LOG_ERROR
(for `describe` and `brokers` offline too)
the controller's own start-up gives."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from controller.core.config import ControllerConfig
from metadata_image.snapshot import image_from_records, to_snapshot
from metadata_log.records import MetadataRecord
from metadata_log.sqlite_store import SqliteLogStore
from ops.cli import main
from tests.controller.testkit import Cluster


def history() -> tuple[list[MetadataRecord], list[MetadataRecord]]:
    """The records up to the snapshot (brokers 1-3, topic t led by 1, ISR [1,2,3]), and
    those after it (broker 1 fenced: t-0's leader moves to 2)."""
    c = Cluster(ControllerConfig())
    c.start(1, 2, 3)
    c.create("t", replication_factor=3, min_isr=2)
    assert c.view("t") == (1, [1, 2, 3], [], [])
    before = list(c.log)
    c.fence(1)
    return before, list(c.log)[len(before) :]


def write_truncated(log_dir: Path) -> tuple[int, list[MetadataRecord]]:
    """A log of both parts, with a snapshot at the boundary and the part before it
    deleted; the snapshot's offset, and the records after it."""
    before, after = history()

    async def run() -> None:
        async with await SqliteLogStore.open(log_dir) as store:
            await store.append(before, timestamp_ms=1_700_000_000_000)
            image = image_from_records(before, len(before))
            await store.write_snapshot(len(before), to_snapshot(image))
            await store.append(after, timestamp_ms=1_700_000_001_000)
            assert await store.delete_before_snapshot() == len(before)
            assert store.start_offset == len(before)

    asyncio.run(run())
    return len(before), after


def test_lines_after_a_snapshot_are_told_against_its_image(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_truncated(tmp_path)
    capsys.readouterr()
    assert main(["events", "--data-dir", str(tmp_path)]) == 0
    texts = [line.split("  ", 1)[1] for line in capsys.readouterr().out.splitlines()]
    assert "broker 1 fenced (session expired)" in texts, texts
    (leader,) = [t for t in texts if t.startswith("t-0 leader ")]
    # From the snapshot: the leader was 1 and the ISR [1,2,3] (not "?").
    assert leader.startswith("t-0 leader 1→2 ("), leader
    assert "isr [1,2,3]→[2,3]" in leader, leader


@pytest.mark.parametrize("command", [["events"], ["describe"], ["brokers"]])
def test_a_log_truncated_without_a_snapshot_is_a_named_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    start, _ = write_truncated(tmp_path)
    with sqlite3.connect(tmp_path / "metadata.log.sqlite") as db:
        db.execute("DELETE FROM snapshots")
    db.close()
    capsys.readouterr()
    assert main([*command, "--data-dir", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"error: LOG_ERROR: the log starts at offset {start} and there is no snapshot to "
        "start from\n"
    )
