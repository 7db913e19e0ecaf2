"""`metactl log dump|verify|tail`, run through the real CLI entry point."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from metadata_log.records import (
    MetadataRecord,
    RegisterBrokerRecord,
    TopicRecord,
    record_type,
    to_builtins,
)
from metadata_log.sqlite_format import LOG_FILE_NAME
from metadata_log.sqlite_store import SqliteLogStore
from ops.cli import main
from tests.metadata_log.log_fixtures import REPO, LineReader, change

RECORDS: list[MetadataRecord] = [
    RegisterBrokerRecord(broker_id=1, incarnation_id="inc-1", broker_epoch=0, rack="r1"),
    TopicRecord(name="payments", topic_id="tid-1", partitions=2, min_isr=2),
    change(7, topic="payments"),
    RegisterBrokerRecord(broker_id=2, incarnation_id="inc-2", broker_epoch=3),
    change(8, topic="payments"),
]


def append(
    data_dir: Path, records: list[MetadataRecord], timestamp_ms: int = 1_700_000_000_000
) -> range:
    async def run() -> range:
        async with await SqliteLogStore.open(data_dir) as store:
            return await store.append(records, timestamp_ms=timestamp_ms)

    return asyncio.run(run())


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()  # drop whatever the test's own set-up printed
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def test_dump_prints_one_readable_line_per_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    append(tmp_path, RECORDS)
    status, out, err = cli(capsys, "log", "dump", "--data-dir", str(tmp_path))
    assert status == 0, err
    lines = out.splitlines()
    assert len(lines) == len(RECORDS)
    assert lines[1].split()[:3] == ["1", "2023-11-14T22:13:20.000Z", "Topic"]
    assert "name=payments" in lines[1] and "partitions=2" in lines[1]
    assert "isr=[" in lines[2]


def test_dump_json_lines_carry_offset_timestamp_crc_and_every_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    append(tmp_path, RECORDS, timestamp_ms=42)
    status, out, _ = cli(capsys, "log", "dump", "--data-dir", str(tmp_path), "--json")
    assert status == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["offset"] for r in rows] == [0, 1, 2, 3, 4]
    assert {r["timestamp_ms"] for r in rows} == {42}
    assert all(isinstance(r["crc"], int) for r in rows)
    for row, record in zip(rows, RECORDS, strict=True):
        assert {k: v for k, v in row.items() if k not in ("offset", "timestamp_ms", "crc")} == (
            json.loads(json.dumps(to_builtins(record)))
        )


def test_dump_filters_by_type_and_range(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    append(tmp_path, RECORDS)
    status, out, _ = cli(
        capsys, "log", "dump", "--data-dir", str(tmp_path), "--json", "--type", "RegisterBroker"
    )
    assert status == 0
    assert [json.loads(line)["offset"] for line in out.splitlines()] == [0, 3]
    status, out, _ = cli(
        capsys,
        "log", "dump", "--data-dir", str(tmp_path), "--json",
        "--type", "partitionchangerecord,topic", "--from", "1", "--to", "4",
    )  # fmt: skip
    assert status == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["offset"], r["type"]) for r in rows] == [(1, "Topic"), (2, "PartitionChange")]
    assert record_type(RECORDS[2]) == "PartitionChange"


def test_dump_errors_are_one_line_with_a_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = cli(capsys, "log", "dump", "--data-dir", str(tmp_path / "nothing"))
    assert status == 4  # not found (docs/cli.md)
    assert err.startswith("error: LOG_DIR_NOT_FOUND: no metadata log ")
    assert str(tmp_path / "nothing" / "controller") in err  # both places tried are named
    assert "Traceback" not in err and out == ""
    append(tmp_path, RECORDS)
    status, _, err = cli(capsys, "log", "dump", "--data-dir", str(tmp_path), "--type", "Bogus")
    assert status == 1
    assert err.startswith("error: INVALID_REQUEST: unknown record type 'Bogus'")
    status, _, err = cli(capsys, "log", "dump", "--data-dir", str(tmp_path), "--from", "99")
    assert status == 1
    assert err.startswith("error: OFFSET_OUT_OF_RANGE: ")


def test_verify_passes_a_good_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    append(tmp_path, RECORDS)
    status, out, err = cli(capsys, "log", "verify", "--data-dir", str(tmp_path))
    assert status == 0, err
    assert out.startswith(f"ok: {tmp_path / LOG_FILE_NAME}: 5 records in 1 batches")


def test_verify_names_the_file_and_first_bad_offset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    append(tmp_path, RECORDS[:2], timestamp_ms=1)
    bad = append(tmp_path, [TopicRecord(name="flip-me-now", topic_id="x", partitions=1, min_isr=1)])
    append(tmp_path, RECORDS[2:], timestamp_ms=3)
    path = tmp_path / LOG_FILE_NAME
    data = bytearray(path.read_bytes())
    at = data.find(b"flip-me-now")
    data[at] ^= 0x20
    path.write_bytes(bytes(data))

    status, out, err = cli(capsys, "log", "verify", "--data-dir", str(tmp_path))
    assert status == 1
    assert out == ""
    assert err.startswith("error: CORRUPT_MESSAGE: batch CRC mismatch")
    assert f"file: {path}" in err
    assert f"first bad offset: {bad.start}" in err
    assert "Traceback" not in err


@pytest.mark.slow
def test_tail_follows_new_records_until_interrupted(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    append(data_dir, RECORDS[:3])
    command = ["log", "tail", "--data-dir", str(data_dir), "--from", "0", "--json"]
    stderr_path = tmp_path / "tail-stderr.txt"
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ops.cli", *command],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        try:
            assert proc.stdout is not None
            lines = LineReader(proc.stdout, "metactl log tail")
            seen = [json.loads(lines.next()) for _ in range(3)]
            assert [r["offset"] for r in seen] == [0, 1, 2]
            # Another process (this one) appends while tail waits.
            append(data_dir, RECORDS[3:])
            later = [json.loads(lines.next()) for _ in range(2)]
            assert [(r["offset"], r["type"]) for r in later] == [
                (3, "RegisterBroker"),
                (4, "PartitionChange"),
            ]
            assert later[1]["topic"] == "payments"
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    err = stderr_path.read_text()
    assert proc.returncode == 130, err  # interrupted (docs/cli.md), without a traceback
    assert "Traceback" not in err
