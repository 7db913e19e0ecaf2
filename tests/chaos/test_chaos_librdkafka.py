"""`metactl chaos run --client librdkafka`: a client nobody here wrote (confluent-kafka)
produces with acks=all and idempotence through lossy correlated outages.

The checker's content-based inputs (`chaos.check.content_inputs`) are pure and tested on
planted histories, a planted bug among them: a value gone from its offset with no
unclean recovery reported after its acknowledgement must be a silent loss. The slow tests
run the built-in `outage` (3 brokers, RF 3, each lossily killed once fenced) with a flush
interval longer than the run, so every acknowledged record is lost from every replica:
with KIP-966 the controller reports each partition's loss (0 silent), in classic mode it
says nothing and the checker finds the loss silent; either way librdkafka's consumer,
following every partition, detects the truncation through OffsetForLeaderEpoch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from chaos.check import NOT_HELD, Ack, ValueAck, classify, content_inputs
from chaos.processes import Processes, port_plan
from tests.e2e.test_chaos import rec
from tests.processes import alive, run_stopping

CLI = [sys.executable, "-m", "ops.cli", "chaos", "run", "--client", "librdkafka"]


# --- the content-based checker (pure) ---------------------------------------------------------


def test_content_inputs_judge_presence_by_the_value_at_the_offset() -> None:
    logs = {
        0: {0: (0, b"p0-0"), 1: (0, b"p0-1"), 2: (3, b"p0-9"), 3: (3, b"p0-10")},
        1: {0: (1, b"p1-0")},
    }
    acks = [
        ValueAck(0, 0, b"p0-0", bound=5),  # present, epoch 0
        ValueAck(0, 2, b"p0-2", bound=5),  # another value at its offset: lost
        ValueAck(0, 7, b"p0-7", bound=5),  # beyond the final log: lost
        ValueAck(1, 0, b"p1-0", bound=None),  # present: no bound needed
        ValueAck(2, 0, b"p2-0", bound=5),  # partition 2 not read: unreadable
    ]
    inputs, committed = content_inputs(acks, logs)
    assert committed == {0: [(0, 2, 0), (2, 4, 3)], 1: [(0, 1, 1)]}
    assert [a.leader_epoch for a in inputs] == [0, NOT_HELD, NOT_HELD, 1, NOT_HELD]
    assert inputs[0] == Ack(0, 0, 1, 0, 5)
    v = classify(inputs, committed, [rec(6, 0)])  # a reported loss of partition 0 after
    assert (v.present, v.lost_reported, v.lost_silent, v.unreadable) == (2, 2, 0, 1)


def test_planted_bug_a_missing_value_without_a_report_is_silent() -> None:
    """A broker that drops acknowledged records with no unclean recovery reported (or
    one reported before the acknowledgement) must be caught."""
    logs = {0: {0: (0, b"p0-0"), 1: (2, b"p0-5")}}  # offset 1 was p0-1, now another value
    acks = [ValueAck(0, 0, b"p0-0", bound=3), ValueAck(0, 1, b"p0-1", bound=3)]
    for recoveries in ([], [rec(2, 0)], [rec(9, 1)]):  # none, before the ack, elsewhere
        v = classify(*content_inputs(acks, logs), recoveries)
        assert (v.present, v.lost_silent, v.lost_reported) == (1, 1, 0), recoveries
        assert v.silent_examples[0]["base_offset"] == 1
    unbounded = [ValueAck(0, 1, b"p0-1", bound=None)]  # never bounded: silent, not reported
    assert classify(*content_inputs(unbounded, logs), [rec(9, 0)]).lost_silent == 1
    # Same value, unknown epoch (-1): still present (presence is by content).
    assert classify(*content_inputs(acks[:1], {0: {0: (-1, b"p0-0")}}), []).present == 1


def test_kafka_listeners_get_ports_of_their_own() -> None:
    p = port_plan(30_000, controllers=1, etcd=0, brokers=3, kafka=True)
    assert p.brokers == {1: 30_002, 2: 30_003, 3: 30_004}
    assert p.kafka == {1: 30_005, 2: 30_006, 3: 30_007}
    assert p.kafka_bootstrap() == "127.0.0.1:30005,127.0.0.1:30006,127.0.0.1:30007"
    assert port_plan(30_000, controllers=1, etcd=0, brokers=3).kafka == {}  # unchanged
    free = port_plan(None, controllers=1, etcd=0, brokers=3, kafka=True)
    assert len(set(free.kafka.values())) == 3 and 0 not in free.kafka.values()
    procs = Processes(
        root=Path("/nonexistent"),
        brokers=3,
        strategy="balanced",
        elr=True,
        unclean_leader_election=False,
        ports=p,
    )
    cmd = procs.broker_cmd(2, lose_unflushed=False)
    assert cmd[cmd.index("--kafka-listen") + 1] == "127.0.0.1:30006"


# --- real processes -------------------------------------------------------------------------


def outage(tmp_path: Path, *flags: str) -> tuple[int, dict[str, object], str]:
    report_file = tmp_path / "report.json"
    r = run_stopping(  # on a timeout, SIGINT first: the run stops what it started
        [*CLI, "--brokers", "3", "--partitions", "2", "--schedule", "builtin:outage",
         "--duration", "1", "--flush-interval-ms", "30000", "--progress", "off",
         "--data-dir", str(tmp_path / "run"), "--report", str(report_file), "--json", *flags],
        timeout=170,
    )  # fmt: skip
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert json.loads(report_file.read_text()) == doc
    assert all(not alive(pid) for pid in doc["pids"])  # type: ignore[attr-defined]
    return r.returncode, doc, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(210)  # the run's 170 s, and 30 s to stop it
def test_librdkafka_through_an_outage_kip966_reports_every_loss(tmp_path: Path) -> None:
    code, doc, out = outage(tmp_path)
    assert code == 0, out
    assert doc["client"] == "librdkafka"
    assert doc["acknowledged"] > 0  # type: ignore[operator]
    assert doc["lost_silent"] == 0
    assert doc["lost_reported"] > 0  # type: ignore[operator]
    assert doc["present"] + doc["lost_reported"] == doc["acknowledged"]  # type: ignore[operator]
    assert doc["unclean_recoveries"] == doc["potential_data_loss_metric"] == 2
    # How many truncations the following consumer sees depends on where it stood when
    # the leader changed: counted and reported, not asserted here (the deterministic
    # case is tests/brokers_stub/test_kafka_truncation.py).
    assert isinstance(doc["consumer_truncations"], int)
    assert doc["follower_caught_up"] is True  # it went on past the truncation
    # Every acknowledgement is a line of the acked log, fsynced before it counted.
    lines = (tmp_path / "run" / "acked.jsonl").read_text().splitlines()
    assert len(lines) == doc["acknowledged"]


@pytest.mark.slow
@pytest.mark.timeout(210)  # the run's 170 s, and 30 s to stop it
def test_librdkafka_through_an_outage_classic_loses_silently(tmp_path: Path) -> None:
    code, doc, out = outage(tmp_path, "--eligible-leader-replicas", "disabled")
    assert code == 3, out  # the verdict: a silent loss
    assert doc["unclean_recoveries"] == 0
    assert doc["lost_silent"] > 0  # type: ignore[operator]
