"""The transaction markers in a real log: stored and read back like any record, refused
past the batch limit as one append, shown by `log dump`, exported by `log export` (every
record as stored, aborted ones included), and left out of the offline image when their
transaction was aborted or never ended."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow.dataset as ds
import pytest

import ops.cli
from metactl.errors import InvalidRequestError
from metadata_log.records import (
    MAX_BATCH_BYTES,
    AbortTransactionRecord,
    BeginTransactionRecord,
    EndTransactionRecord,
    MetadataRecord,
    RegisterBrokerRecord,
    TopicRecord,
)
from metadata_log.sqlite_store import SqliteLogStore
from ops.describe_cmds import offline_view


def reg(broker_id: int) -> RegisterBrokerRecord:
    return RegisterBrokerRecord(broker_id=broker_id, incarnation_id=f"i{broker_id}", broker_epoch=0)


LOG: list[MetadataRecord] = [
    reg(1),  # 0
    BeginTransactionRecord(name="RegisterBroker 2"),  # 1
    reg(2),  # 2
    AbortTransactionRecord(reason="controller start: no end marker"),  # 3
    BeginTransactionRecord(name="CreateTopic t"),  # 4
    TopicRecord(name="t", topic_id="t", partitions=0, min_isr=1),  # 5
    EndTransactionRecord(),  # 6
    BeginTransactionRecord(name="RegisterBroker 3"),  # 7
    reg(3),  # 8: the log ends inside this transaction
]


def _write(data_dir: Path, records: list[MetadataRecord]) -> None:
    async def run() -> None:
        async with await SqliteLogStore.open(data_dir) as store:
            for r in records:  # one batch each, as the driver writes a large change
                await store.append([r], timestamp_ms=1_700_000_000_000)

    asyncio.run(run())


async def test_markers_are_stored_and_read_back(tmp_path: Path) -> None:
    async with await SqliteLogStore.open(tmp_path) as store:
        await store.append(LOG, timestamp_ms=1)
        assert [e.record for e in await store.read(0, 100)] == LOG
        report = await store.verify()
        assert report.records == len(LOG)


async def test_an_append_over_the_batch_limit_is_refused_by_name(tmp_path: Path) -> None:
    big = [TopicRecord(name="x" * 1000, topic_id="t", partitions=1, min_isr=1)] * (
        MAX_BATCH_BYTES // 1000 + 10
    )
    async with await SqliteLogStore.open(tmp_path) as store:
        with pytest.raises(InvalidRequestError, match="exceeds"):
            await store.append(big, timestamp_ms=1)
        assert store.end_offset == 0


def test_dump_shows_every_record_markers_included(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(tmp_path, LOG)
    capsys.readouterr()
    assert ops.cli.main(["log", "dump", "--data-dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(LOG)
    assert "BeginTransaction" in lines[1] and "RegisterBroker 2" in lines[1]
    args = ["log", "dump", "--data-dir", str(tmp_path), "--type", "AbortTransaction"]
    assert ops.cli.main(args) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.split()[0] == "3" and "no end marker" in line


def test_offline_image_leaves_out_aborted_and_unfinished_transactions(tmp_path: Path) -> None:
    _write(tmp_path, LOG)
    image, end, _ = asyncio.run(offline_view(tmp_path))  # what `describe --data-dir` reads
    assert end == len(LOG)
    assert set(image.brokers) == {1}  # 2 was aborted, 3 never ended
    assert set(image.topics) == {"t"}
    assert image.end_offset == 7


def test_export_writes_every_record_as_stored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if "ops.export_cmds" not in ops.cli.COMMAND_MODULES:
        monkeypatch.setattr(
            ops.cli, "COMMAND_MODULES", (*ops.cli.COMMAND_MODULES, "ops.export_cmds")
        )
    data, out = tmp_path / "data", tmp_path / "pq"
    _write(data, LOG)
    capsys.readouterr()
    status = ops.cli.main(["log", "export", "--data-dir", str(data), "--parquet", str(out)])
    assert status == 0, capsys.readouterr().err
    table = ds.dataset(out, partitioning="hive").to_table().sort_by("offset")
    rows = table.select(["offset", "record_type", "reason", "broker"]).to_pylist()
    assert [r["record_type"] for r in rows] == [
        "RegisterBroker",
        "BeginTransaction",
        "RegisterBroker",
        "AbortTransaction",
        "BeginTransaction",
        "Topic",
        "EndTransaction",
        "BeginTransaction",
        "RegisterBroker",
    ]
    assert rows[3]["reason"] == "controller start: no end marker"
    assert rows[2]["broker"] == 2  # the aborted registration is exported, as stored
