"""`describe` and `brokers` offline, on a real SQLite log written here: Kafka's partition
filters, a cluster's data directory and the controller's both accepted, fence reasons
and recent unclean recoveries from the records' commit times, a transaction counted only
once committed."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest

from metadata_log.records import (
    AbortTransactionRecord,
    BeginTransactionRecord,
    FenceBrokerRecord,
    MetadataRecord,
    PartitionRecord,
    RecoveryCandidate,
    RegisterBrokerRecord,
    TopicRecord,
    UncleanRecoveryRecord,
    UnfenceBrokerRecord,
)
from metadata_log.sqlite_store import SqliteLogStore
from ops.cli import main


def write(log_dir: Path, batches: list[tuple[list[MetadataRecord], int]]) -> None:
    async def run() -> None:
        async with await SqliteLogStore.open(log_dir) as store:
            for records, ts in batches:
                await store.append(records, timestamp_ms=ts)

    asyncio.run(run())


def cluster(data: Path) -> Path:
    """A cluster data dir (`cluster up`'s layout) whose log holds four partitions of
    topic `t` (RF 3, MinISR 2): healthy, under-replicated at MinISR, under MinISR, and
    leaderless; broker 3 killed (session expired), broker 2 fenced then registered again."""
    now = int(time.time() * 1000)
    brokers: list[MetadataRecord] = []
    for b in (1, 2, 3):
        brokers += [
            RegisterBrokerRecord(broker_id=b, incarnation_id=f"i{b}", broker_epoch=2 * (b - 1)),
            UnfenceBrokerRecord(broker_id=b, broker_epoch=2 * (b - 1)),
        ]
    topic: list[MetadataRecord] = [
        TopicRecord(name="t", topic_id="tid", partitions=4, min_isr=2),
        PartitionRecord(
            topic="t", partition=0, replicas=[1, 2, 3], isr=[1, 2, 3], leader=1, min_isr=2
        ),
        PartitionRecord(
            topic="t", partition=1, replicas=[1, 2, 3], isr=[1, 2], leader=1, min_isr=2
        ),
        PartitionRecord(topic="t", partition=2, replicas=[1, 2, 3], isr=[1], leader=1, min_isr=2),
        PartitionRecord(topic="t", partition=3, replicas=[1, 2, 3], isr=[], leader=-1, min_isr=2),
    ]
    recovery = UncleanRecoveryRecord(
        topic="t", partition=2, strategy="balanced", trigger="isr_and_elr_empty", chosen=1,
        candidates=[RecoveryCandidate(broker_id=1, last_leader_epoch=0, log_end_offset=5),
                    RecoveryCandidate(broker_id=2, last_leader_epoch=0, log_end_offset=4)],
    )  # fmt: skip
    old = UncleanRecoveryRecord(
        topic="t", partition=1, strategy="manual", chosen=2, trigger="operator", candidates=[]
    )
    aborted: list[MetadataRecord] = [
        BeginTransactionRecord(name="never"),
        UncleanRecoveryRecord(
            topic="t", partition=0, strategy="manual", chosen=3, trigger="operator", candidates=[]
        ),
        AbortTransactionRecord(reason="test"),
    ]
    fences: list[MetadataRecord] = [
        FenceBrokerRecord(broker_id=3, broker_epoch=4, reason="session_timeout"),
        FenceBrokerRecord(broker_id=2, broker_epoch=2, reason="session_timeout"),
        RegisterBrokerRecord(broker_id=2, incarnation_id="i2b", broker_epoch=17, clean=True),
    ]
    write(
        data / "controller",
        [
            (brokers + topic, now - 10 * 86_400_000),
            ([old], now - 3 * 86_400_000),  # older than a day
            (aborted, now - 120_000),
            ([recovery], now - 125_000),  # about two minutes ago
            (fences, now - 1_000),
        ],
    )
    return data


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def partitions(out: str) -> list[int]:
    return [
        int(dict(f.split(": ", 1) for f in line.strip().split("\t"))["Partition"])
        for line in out.splitlines()
        if line.startswith("\t")
    ]


def test_kafkas_filters_print_the_matching_partitions_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = cluster(tmp_path / "data")
    status, out, err = run(capsys, "describe", "--data-dir", str(data))
    assert status == 0, err
    assert partitions(out) == [0, 1, 2, 3]
    assert out.splitlines()[0] == (
        "Topic: t\tTopicId: tid\tPartitionCount: 4\tReplicationFactor: 3\t"
        "Configs: min.insync.replicas=2"
    )
    for flag, expected in (
        ("--under-replicated-partitions", [1, 2, 3]),
        ("--at-min-isr-partitions", [1]),
        ("--under-min-isr-partitions", [2, 3]),
        ("--unavailable-partitions", [3]),
    ):
        status, out, err = run(capsys, "describe", "--data-dir", str(data), flag)
        assert status == 0, err
        assert partitions(out) == expected, flag
        assert not any(line.startswith("Topic:") for line in out.splitlines())  # as Kafka
    status, out, _ = run(
        capsys, "describe", "--data-dir", str(data), "--unavailable-partitions", "--json"
    )
    assert [p["partition"] for p in json.loads(out)["partitions"]] == [3]


def test_a_cluster_data_dir_and_the_controllers_are_both_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = cluster(tmp_path / "data")
    for where in (data, data / "controller"):
        for argv in (["describe"], ["brokers"], ["events"], ["log", "dump"], ["log", "verify"]):
            status, out, err = run(capsys, *argv, "--data-dir", str(where))
            assert status == 0 and out, (argv, where, err)


def test_recent_unclean_recoveries_and_why_brokers_are_fenced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = cluster(tmp_path / "data")
    status, out, _ = run(capsys, "describe", "--data-dir", str(data))
    shown = [line for line in out.splitlines() if line.startswith("	")]
    lines = dict(zip(partitions(out), shown, strict=True))
    assert status == 0
    note = lines[2].split("\tLastUncleanRecovery: ")[1]
    age = re.fullmatch(
        r"chose 1 of \[1,2\] \(balanced, isr_and_elr_empty\) (\d+)m(\d\d)s ago"
        " — potential data loss",
        note,
    )
    assert age is not None, note
    assert int(age[1]) * 60 + int(age[2]) >= 125  # committed 125 s before `cluster` ran
    # Three days old: outside the default 24 h; the aborted one never happened.
    assert "LastUncleanRecovery" not in lines[1] and "LastUncleanRecovery" not in lines[0]
    status, out, _ = run(capsys, "describe", "--data-dir", str(data), "--recent-recoveries", "7d")
    assert "LastUncleanRecovery: chose 2 (manual, operator) 3d00h ago" in out
    assert "chose 3" not in out
    for never in ("1m", "0", "0s"):
        status, out, _ = run(
            capsys, "describe", "--data-dir", str(data), "--recent-recoveries", never
        )
        assert status == 0 and "LastUncleanRecovery" not in out, never
    status, _, err = run(capsys, "describe", "--data-dir", str(data), "--recent-recoveries", "soon")
    assert status == 2 and err.startswith("error: INVALID_CONFIG: --recent-recoveries 'soon'")

    status, out, _ = run(capsys, "brokers", "--data-dir", str(data))
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert status == 0
    assert rows["1"].split()[2] == "no" and "active" in rows["1"]
    assert rows["3"].split()[2] == "yes" and "fenced: session expired" in rows["3"]
    assert "fenced: registered, catching up" in rows["2"]  # fenced again by its registration
    status, out, _ = run(capsys, "brokers", "--data-dir", str(data), "--json")
    by_id = {b["broker_id"]: b for b in json.loads(out)["brokers"]}
    assert (by_id[1]["fenced_reason"], by_id[3]["fenced_reason"]) == (None, "session_timeout")
