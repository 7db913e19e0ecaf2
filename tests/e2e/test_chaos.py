"""`metactl chaos run` end to end, and its checker on planted histories.

The bounded run uses the built-in `outage` schedule on 3 brokers (every partition on
every broker): brokers 1, 2, 3 are SIGKILLed one after the other, each once fenced, and
restarted with page-cache loss, so every partition's ISR shrinks into its ELR, empties,
moves to the LastKnownELR on the unclean registrations and is recovered by balanced
unclean recovery. The checker must find no silent loss, and the metric must count what
the log says.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chaos.check import Ack, Recovery, classify, counter_sum, leaderless_seconds
from chaos.report import table
from metadata_log.records import (
    NO_LEADER,
    ChangeReason,
    PartitionChangeRecord,
    PartitionRecord,
    UncleanRecoveryRecord,
)
from protocol.messages.broker_controller import FetchedRecord
from tests.processes import alive, run_stopping, wait_exit

FENCE = ChangeReason.FENCE
CLI = [sys.executable, "-m", "ops.cli", "chaos", "run"]
KEYS = {
    "faults",
    "acknowledged",
    "lost_reported",
    "lost_silent",
    "unavailable_partition_seconds",
    "unclean_recoveries",
    "potential_data_loss_metric",
    "acked_records_per_s",
}


# --- the checker ------------------------------------------------------------------------


def rec(offset: int, partition: int, bound_ok: bool = True) -> Recovery:
    return Recovery(
        offset=offset,
        timestamp_ms=0,
        partition=partition,
        strategy="balanced",
        chosen=1,
        trigger="isr_and_elr_empty",
        potential_data_loss=bound_ok,
    )


def test_checker_classifies_present_reported_silent_and_unreadable() -> None:
    committed = {0: [(0, 10, 1), (10, 15, 3)], 1: [(0, 5, 2)]}
    acks = [
        Ack(0, 0, 10, 1, bound=4),  # present
        Ack(0, 10, 10, 1, bound=4),  # offsets 10..19 of epoch 1: gone, recovery at 7 >= 4
        Ack(1, 5, 5, 2, bound=4),  # gone, no recovery of partition 1: silent
        Ack(2, 0, 3, 1, bound=4),  # partition 2 was not read
    ]
    v = classify(acks, committed, [rec(7, 0)])
    assert (v.present, v.lost_reported, v.lost_silent, v.unreadable) == (10, 10, 5, 3)
    assert v.silent_examples == [
        {
            "partition": 1,
            "base_offset": 5,
            "count": 5,
            "leader_epoch": 2,
            "lost": 5,
            "ack_metadata_bound": 4,
        }
    ]


def test_a_recovery_before_the_ack_or_an_unbounded_ack_is_silent() -> None:
    committed = {0: [(0, 5, 2)]}
    # Same offsets, another epoch: the record at (0, epoch 1) is gone.
    before = classify([Ack(0, 0, 5, 1, bound=9)], committed, [rec(8, 0)])
    assert (before.lost_reported, before.lost_silent) == (0, 5)
    unbounded = classify([Ack(0, 0, 5, 1, bound=None)], committed, [rec(8, 0)])
    assert unbounded.lost_silent == 5
    # A recovery record that does not claim potential data loss reports nothing.
    not_claimed = classify([Ack(0, 0, 5, 1, bound=1)], committed, [rec(8, 0, bound_ok=False)])
    assert not_claimed.lost_silent == 5
    after = classify([Ack(0, 0, 5, 1, bound=8)], committed, [rec(8, 0)])
    assert after.lost_reported == 5


def test_leaderless_seconds_from_record_timestamps() -> None:
    def f(offset: int, ts: int, r: object) -> FetchedRecord:
        return FetchedRecord(offset, ts, r)  # type: ignore[arg-type]

    records = [
        f(0, 1000, PartitionRecord(topic="t", partition=0, replicas=[1], isr=[1], leader=1)),
        f(1, 2000, PartitionChangeRecord(topic="t", partition=0, reason=FENCE,
                                         partition_epoch=1, leader_epoch=1, leader=NO_LEADER)),
        f(2, 2500, PartitionChangeRecord(topic="t", partition=0, reason=FENCE,
                                         partition_epoch=2, leader_epoch=1, isr=[])),
        f(3, 4000, PartitionChangeRecord(topic="t", partition=0, reason=FENCE,
                                         partition_epoch=3, leader_epoch=2, leader=1)),
        f(4, 5000, PartitionChangeRecord(topic="t", partition=0, reason=FENCE,
                                         partition_epoch=4, leader_epoch=2, leader=NO_LEADER)),
        f(5, 5000, UncleanRecoveryRecord(topic="t", partition=0, strategy="balanced",
                                         candidates=[], chosen=1)),
    ]  # fmt: skip
    assert leaderless_seconds(records, "t", end_ms=6500) == 2.0 + 1.5


def test_counter_sum_adds_every_series() -> None:
    text = (
        "# TYPE metactl_potential_data_loss_events counter\n"
        'metactl_potential_data_loss_events_total{strategy="balanced",topic="a"} 2.0\n'
        'metactl_potential_data_loss_events_created{strategy="balanced",topic="a"} 1.7e9\n'
        'metactl_potential_data_loss_events_total{strategy="manual",topic="a"} 1.0\n'
    )
    assert counter_sum(text, "metactl_potential_data_loss_events") == 3.0


def test_bad_flags_are_named_errors(tmp_path: Path) -> None:
    for flags, words in [
        (["--brokers", "0"], "--brokers"),
        (["--rf", "4", "--brokers", "3"], "--rf"),
        (["--unclean-leader-election"], "--eligible-leader-replicas disabled"),
        (["--schedule", "builtin:nope"], "no built-in schedule"),
        (["--schedule", str(tmp_path / "missing.json")], "cannot read the schedule"),
    ]:
        r = subprocess.run([*CLI, *flags], check=False, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (flags, r.stderr)
        assert "error:" in r.stderr and words in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


# --- real processes ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(150)  # the run's 110 s, and 30 s to stop it
def test_outage_run_recovers_uncleanly_without_silent_loss(tmp_path: Path) -> None:
    report_file = tmp_path / "report.json"
    r = run_stopping(  # on a timeout, SIGINT first: the run stops what it started
        [*CLI, "--brokers", "3", "--partitions", "2", "--schedule", "builtin:outage",
         "--duration", "1", "--data-dir", str(tmp_path / "run"), "--report", str(report_file),
         "--json"],
        timeout=110,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("STARTED ")
    doc = json.loads(lines[-1])
    assert json.loads(report_file.read_text()) == doc
    assert set(doc) >= KEYS
    assert doc["acknowledged"] > 0
    assert doc["faults"] == doc["lossy_kills"] == 3
    assert doc["unclean_recoveries"] >= 1
    assert doc["potential_data_loss_metric"] == doc["unclean_recoveries"]
    assert doc["lost_silent"] == 0
    assert doc["present"] + doc["lost_reported"] == doc["acknowledged"]
    assert all(not alive(pid) for pid in doc["pids"])
    assert "verdict" in table(doc)


def start_long_run(tmp_path: Path, *, stderr: int) -> tuple[subprocess.Popen[str], Any]:
    """A 120-second `chaos run` started, and its STARTED line once the cluster is up."""
    proc = subprocess.Popen(
        [*CLI, "--brokers", "3", "--partitions", "2", "--duration", "120", "--seed", "3",
         "--data-dir", str(tmp_path / "run"), "--json"],
        stdout=subprocess.PIPE, stderr=stderr, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    first = proc.stdout.readline()  # blocks until the cluster is up
    if not first.startswith("STARTED "):
        proc.kill()
        proc.wait()
    assert first.startswith("STARTED "), first
    return proc, json.loads(first.removeprefix("STARTED "))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigint_stops_everything_and_prints_a_partial_report(tmp_path: Path) -> None:
    proc, started = start_long_run(tmp_path, stderr=subprocess.PIPE)
    try:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err[-3000:]
    doc = json.loads(out.strip().splitlines()[-1])
    assert doc["interrupted"] is True
    assert doc["verdict"] == "interrupted"
    assert set(doc) >= KEYS
    assert set(started["pids"].values()) <= set(doc["pids"])
    assert all(not alive(pid) for pid in doc["pids"])
    assert "Traceback" not in err


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_killed_run_takes_its_processes_with_it(tmp_path: Path) -> None:
    """Issue 33: a `chaos run` SIGKILLed (as subprocess.run's timeout does) left its
    controller and brokers running for minutes; they now die with it (pdeathsig)."""
    proc, info = start_long_run(tmp_path, stderr=subprocess.DEVNULL)
    started = info["pids"]
    try:
        assert len(started) == 4 and all(alive(pid) for pid in started.values())
        proc.kill()
        proc.wait()
        assert all(wait_exit(pid, 30.0) for pid in started.values()), started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
