"""`metactl produce` and `metactl consume`: the pure helpers, bad input, and one run end
to end on a real controller and three real broker processes, all over mutual TLS (the
CLI as `admin`, and as `viewer`, who may read but not produce)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from clients.consumer import digest, missing_records, ranges
from ops.cli import main
from protocol.messages.admin import DescribeClusterResponse
from tests.e2e.cluster import Cluster


def test_ranges_cut_the_history_at_the_high_watermark() -> None:
    history = [(0, 0), (2, 5), (3, 5), (4, 9)]
    assert ranges(history, 12) == [(0, 5, 0), (5, 9, 3), (9, 12, 4)]  # (2, 5) holds nothing
    assert ranges(history, 7) == [(0, 5, 0), (5, 7, 3)]
    assert ranges([], 0) == [] and ranges([(1, 0)], 0) == []
    assert digest(ranges(history, 12)) != digest(ranges(history, 11))


def test_an_acked_record_survives_iff_its_offset_has_its_epoch() -> None:
    committed = {0: [(0, 5, 0), (5, 9, 3)], 1: [(0, 4, 1)]}
    acked = [
        {"partition": 0, "base_offset": 0, "count": 5, "leader_epoch": 0},  # held
        {"partition": 0, "base_offset": 5, "count": 2, "leader_epoch": 2},  # truncated away
        {"partition": 0, "base_offset": 8, "count": 3, "leader_epoch": 3},  # 8 held, 9-10 not
        {"partition": 1, "base_offset": 0, "count": 4, "leader_epoch": 1},
        {"partition": 7, "base_offset": 0, "count": 1, "leader_epoch": 0},  # not read: skipped
    ]
    assert missing_records(acked, committed) == {0: 4}


def test_bad_input_is_a_named_error_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = str(tmp_path / "acked.jsonl")
    base = ["produce", "--controller", "127.0.0.1:1", "--insecure", "--topic", "t",
            "--acked-log", log]  # fmt: skip
    assert main([*base, "--count", "0"]) == 2
    assert "error: INVALID_CONFIG: --count must be >= 1" in capsys.readouterr().err
    assert main([*base, "--count", "5", "--rate", "0"]) == 2
    assert "--rate must be > 0" in capsys.readouterr().err
    # Nobody listens on port 1: a named network error, exit 5 (unavailable, docs/cli.md).
    assert main([*base, "--count", "5", "--retries", "0"]) == 5
    err = capsys.readouterr().err
    assert err.startswith("error: NETWORK_EXCEPTION") and "Traceback" not in err
    with pytest.raises(SystemExit) as usage:
        main([*base, "--count", "5", "--acks", "0"])
    assert usage.value.code == 2


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    c.start_controller()
    try:
        for b in (1, 2, 3):
            c.start_broker(b, "--fetch-interval-ms", "20")
        yield c
    finally:
        c.stop()


def _ready(s: DescribeClusterResponse) -> bool:
    parts = [p for p in s.partitions if p.topic == "t"]
    return len(parts) == 2 and all(p.leader != -1 and len(p.isr) == 3 for p in parts)


@pytest.mark.slow
def test_produce_then_consume_on_a_real_cluster(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    addr = cluster.address
    tls = cluster.cli_flags
    assert tls[0] == "--tls-dir"  # the cluster runs with mutual TLS
    asyncio.run(
        cluster.wait_until(
            lambda s: len(s.brokers) == 3 and not any(b.fenced for b in s.brokers), "3 brokers"
        )
    )
    create = ["topics", "create", "--controller", addr, "--topic", "t", "--partitions", "2",
              "--replication-factor", "3", "--min-isr", "2", *tls]  # fmt: skip
    assert main(create) == 0
    asyncio.run(cluster.wait_until(_ready, "t led with a full ISR"))
    capsys.readouterr()

    acked = tmp_path / "acked.jsonl"
    status = main(
        ["produce", "--bootstrap-controller", addr, "--topic", "t", "--acks", "all",
         "--count", "400", "--batch", "40", "--in-flight", "2", "--rate", "100000",
         "--acked-log", str(acked), *tls]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0, out
    assert out.strip() == "acked 400 records in 10 batches; refused 0 records: none"
    lines = [json.loads(x) for x in acked.read_text().splitlines()]
    assert len(lines) == 10 and sum(x["count"] for x in lines) == 400
    for p in (0, 1):
        mine = sorted((x["base_offset"], x["count"]) for x in lines if x["partition"] == p)
        assert mine == [(o, 40) for o in range(0, 200, 40)]  # consecutive offsets

    status = main(
        ["consume", "--controller", addr, "--topic", "t", "--from-beginning", "--json",
         "--check-acked", str(acked), *tls]
    )  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert status == 0
    for part in doc["partitions"]:
        epoch = next(x["leader_epoch"] for x in lines if x["partition"] == part["partition"])
        assert part["high_watermark"] == 200
        assert part["ranges"] == [[0, 200, epoch]]
        assert part["missing_acked"] == 0
    viewer = [*tls, "--principal", "viewer"]
    assert main(["consume", "--controller", addr, "--topic", "t", "--from-beginning", *viewer]) == 0
    text = capsys.readouterr().out.splitlines()
    assert len(text) == 2 and all("HighWatermark: 200" in line for line in text)
    # The viewer may read but not produce: refused by the leader, nothing acknowledged.
    status = main(
        ["produce", "--controller", addr, "--topic", "t", "--partition", "0", "--count", "1",
         "--acked-log", str(acked), "--retries", "0", "--json", *viewer]
    )  # fmt: skip
    assert status == 3
    assert json.loads(capsys.readouterr().out)["refused_batches"] == {
        "TOPIC_AUTHORIZATION_FAILED": 1
    }

    # A refused batch is counted by its error and never reaches the acked log: exit 3.
    status = main(
        ["produce", "--controller", addr, "--topic", "t", "--partition", "1", "--count", "20000",
         "--batch", "20000", "--acked-log", str(acked), "--json", *tls]
    )  # fmt: skip
    assert status == 3
    assert json.loads(capsys.readouterr().out) == {
        "acked_records": 0,
        "acked_batches": 0,
        "refused_records": 20000,
        "refused_batches": {"MESSAGE_TOO_LARGE": 1},
    }
    assert len(acked.read_text().splitlines()) == 10

    assert main(["consume", "--controller", addr, "--topic", "nope", *tls]) == 4  # not found
    assert capsys.readouterr().err.startswith("error: UNKNOWN_TOPIC_OR_PARTITION")
