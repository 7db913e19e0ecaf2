"""`metactl roll` on a `cluster up` cluster, as real processes (issue 34).

* Done, as the issue says it: a 4-broker `cluster up` with a topic of RF 3 and MinISR 2,
  an acks=all producer running throughout (`clients.producer`, every acknowledged batch
  in an acked log), a watcher sampling every partition's ISR throughout (DescribeCluster),
  then `metactl roll`: it restarts all 4 brokers (new pids, one step each, its lines per
  stage), no sample ever saw an ISR below MinISR, and neither did the committed log (every
  ISR the controller committed during the roll, read back with `metactl log dump`); no
  batch was refused for want of replicas, and every acknowledged record is there when
  read back. A second roll interrupted with Ctrl-C during its first restart ends with
  130, saying where, and the broker it was restarting runs again (`cluster up` finishes
  the restart). Ctrl-C of `cluster up` then says what it stops, in order.
* A topic that no order can roll (RF 2, MinISR 2): the roll refuses with exit 3, naming
  the partitions that block each broker, and restarts nothing; an unknown broker is
  INVALID_CONFIG, at the command and at the control socket.

Nothing is timed: the tests await lines, events and exits within bounds.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from clients.admin import pages
from clients.consumer import consume, missing_records, ranges, read_acked_log
from clients.controller import INSECURE
from clients.producer import ProduceSummary, produce
from localcluster.control import RECORD_FILE, ask
from metactl.errors import InvalidConfigurationError
from protocol.messages.admin import DescribeClusterRequest
from protocol.messages.data import ACKS_ALL, ReadLogResponse
from tests.ops.test_cluster_supervision import alive, pids
from tests.ops.test_cluster_up import CLI, REPO, Up, env, metactl

pytestmark = pytest.mark.slow

BOUND_S = 120.0  # bounds a wait; nothing is timed
TOPIC = "demo"
MIN_ISR = 2


def bootstrap(up: Up) -> str:
    describe = up.command("describe")
    return describe[describe.index("--bootstrap-controller") + 1]


def recorded_pids(data: Path) -> dict[int, int]:
    record = json.loads((data / RECORD_FILE).read_text())
    return {int(b): int(v["pid"]) for b, v in record["brokers"].items()}


class Watch:
    """Every partition's ISR sampled through DescribeCluster, in a thread of its own,
    until stopped: the smallest ISR each partition had in any sample."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.smallest: dict[int, int] = {}
        self.min_isr: dict[int, int] = {}
        self.samples = 0
        self.committed = 0  # the controller's committed offset at the last sample
        self.failures: list[str] = []
        self.sampled = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        request = DescribeClusterRequest(topic=TOPIC, broker_limit=0, recoveries_within_ms=0)
        async with INSECURE.controller_client(self.address) as client:
            while not self.stop.is_set():
                try:
                    async for page in pages(client, request, timeout_s=10):
                        self.committed = page.committed_offset
                        for p in page.partitions:
                            size = len(p.isr)
                            self.smallest[p.partition] = min(
                                size, self.smallest.get(p.partition, size)
                            )
                            self.min_isr[p.partition] = p.min_isr
                except Exception as exc:  # noted, and sampled again
                    self.failures.append(f"{type(exc).__name__}: {exc}")
                    continue
                self.samples += 1
                self.sampled.set()
                await asyncio.sleep(0.05)  # the sampling period


class Load:
    """acks=all batches to every partition of the topic, one `produce` run after another
    in a thread of its own until stopped, each acknowledged batch in `acked`."""

    def __init__(self, address: str, acked: Path) -> None:
        self.address = address
        self.acked = acked
        self.summaries: list[ProduceSummary] = []
        self.failures: list[str] = []
        self.producing = threading.Event()  # set once a batch was acknowledged
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                summary = asyncio.run(
                    produce(
                        controller=self.address, topic=TOPIC, partition=None, acks=ACKS_ALL,
                        count=100, batch=10, acked_log=self.acked, rate=300.0, in_flight=2,
                        security=INSECURE,
                    )
                )  # fmt: skip
            except Exception as exc:  # noted; the next run looks the leaders up again
                self.failures.append(f"{type(exc).__name__}: {exc}")
                continue
            self.summaries.append(summary)
            if summary.acked_records:
                self.producing.set()

    def batches(self) -> int:
        """Batches acknowledged so far (whole lines of the acked log)."""
        if not self.acked.exists():
            return 0
        return self.acked.read_bytes().count(b"\n")


def read_lines(up: Up, seen: list[str], until: str | None = None) -> str:
    """`cluster up`'s lines added to `seen` up to the one containing `until` (returned),
    or to its end (None: it has been stopped)."""
    lines = up.lines()
    while True:
        line = lines.get(timeout=BOUND_S)
        if line is None:
            assert until is None, f"cluster up ended without {until!r}: {seen}"
            return ""
        seen.append(line.rstrip("\n"))
        if until is not None and until in line:
            return seen[-1]


def test_a_roll_under_acks_all_load_keeps_min_isr_and_every_acknowledged_record(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    up = Up(data, "--brokers", "4", "--insecure", "--partitions", "6", "--min-isr", str(MIN_ISR))
    watch: Watch | None = None
    load: Load | None = None
    try:
        banner = up.await_banner()
        up.lines()  # read from now on: a full pipe would stall cluster up
        out: list[str] = []  # its lines after the banner
        first = pids(banner)
        address = bootstrap(up)
        acked = tmp_path / "acked.jsonl"
        watch, load = Watch(address), Load(address, acked)
        watch.thread.start()
        load.thread.start()
        assert watch.sampled.wait(BOUND_S), watch.failures
        assert load.producing.wait(BOUND_S), load.failures
        before = load.batches()

        r = subprocess.run(
            [*CLI, "roll", "--data-dir", str(data)],
            capture_output=True, text=True, cwd=REPO, env=env(), timeout=600, check=False,
        )  # fmt: skip
        during = load.batches() - before
        lines = r.stdout.splitlines()
        assert r.returncode == 0, r.stdout + r.stderr
        assert lines[0].startswith(f"Rolling 4 broker(s) of the cluster up on {data.resolve()}")
        steps = [x for x in lines if x.startswith("step ")]
        assert [x.split(":")[0] for x in steps] == [f"step {k}/4" for k in range(1, 5)]
        rolled = [int(x.split()[3]) for x in steps]  # "step 1/4: broker 3 (..."
        assert sorted(rolled) == [1, 2, 3, 4]
        for b in rolled:  # each stage of each step said
            for stage in (
                f"  broker {b}: controlled shutdown, then a start…",
                f"  broker {b} stopped (",
                f"  broker {b} started again (pid ",
                f"  broker {b} back in the ISR of ",
            ):
                assert any(x.startswith(stage) for x in lines), (stage, lines)
        assert not any("NOT a controlled shutdown" in x for x in lines), lines
        assert sum(x.startswith("  every partition at or above MinISR") for x in lines) == 4
        assert lines[-1].startswith("Roll done: 4 broker(s) restarted one at a time (")
        assert r.stderr == ""
        # Every broker is a new process, and cluster up said why each one stopped.
        now = recorded_pids(data)
        assert all(now[b] != first[f"broker {b}"] and alive(now[b]) for b in range(1, 5)), now
        assert during > 0, "nothing was acknowledged during the roll"

        # The producer goes on after the roll; then everything stops but the cluster.
        after = load.batches()
        deadline = time.monotonic() + BOUND_S
        while load.batches() == after:  # polling the producer's acked log
            assert time.monotonic() < deadline, load.failures
            time.sleep(0.05)
        load.stop.set()
        load.thread.join(BOUND_S)
        watch.stop.set()
        watch.thread.join(BOUND_S)
        committed = watch.committed

        # No sample saw a partition below MinISR.
        assert watch.samples > 10, watch.samples
        assert sorted(watch.smallest) == list(range(6))
        assert set(watch.min_isr.values()) == {MIN_ISR}
        assert min(watch.smallest.values()) >= MIN_ISR, watch.smallest
        # No batch was refused for want of in-sync replicas.
        refused = {code for s in load.summaries for code in s.refused}
        assert not {c for c in refused if c.startswith("NOT_ENOUGH_REPLICAS")}, refused
        # Every acknowledged record is there.
        results = asyncio.run(
            consume(controller=address, topic=TOPIC, partition=None, security=INSECURE)
        )
        committed_ranges = {}
        for p, res in results:
            assert isinstance(res, ReadLogResponse), (p, res)
            committed_ranges[res.partition] = ranges(res.leader_epochs, res.high_watermark)
        acknowledged = read_acked_log(acked, TOPIC)
        assert len(acknowledged) > during > 0
        assert missing_records(acknowledged, committed_ranges) == {}

        # A second roll, Ctrl-C once cluster up is restarting its first broker: it waits
        # for the broker, which cluster up brings back, and says where it stopped.
        pids_before = recorded_pids(data)
        restarting = "stopping for `metactl roll`"
        while sum(restarting in x for x in out) < 4:  # the first roll's, printed already
            read_lines(up, out, until=restarting)
        roll = subprocess.Popen(
            [*CLI, "roll", "--data-dir", str(data)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env(),
        )  # fmt: skip
        try:
            line = read_lines(up, out, until=restarting)
            broker = int(line.split()[1])  # "   broker 3 stopping for `metactl roll` ..."
            roll.send_signal(signal.SIGINT)
            _, err = roll.communicate(timeout=BOUND_S)
        finally:
            if roll.poll() is None:
                roll.kill()
                roll.wait()
        assert roll.returncode == 130, err
        last = err.splitlines()[-1]
        assert last.startswith(
            f"interrupted: the roll stopped during step 1 of 4; broker {broker} runs (pid "
        ), err
        assert "Traceback" not in err
        pid = int(last.rsplit("(pid ", 1)[1].rstrip(")"))
        assert alive(pid) and recorded_pids(data)[broker] == pid != pids_before[broker]
    finally:
        for worker in (load, watch):
            if worker is not None:
                worker.stop.set()
                worker.thread.join(BOUND_S)
        status = up.stop()
    assert status == 0
    read_lines(up, out)

    # Ctrl-C said what it stopped, in order: the brokers (each one's time), the controller.
    start = out.index("stopping: broker 1, broker 2, broker 3, broker 4 (controlled shutdown)…")
    said = out[start:]
    stopped = sorted(x.split(" (")[0] for x in said[1:5])
    assert stopped == [f"  broker {b} stopped" for b in range(1, 5)], said
    assert said[5] == "stopping: controller…"
    assert said[6].startswith("  controller stopped (")
    assert said[7].startswith("all stopped (")
    # cluster up's own lines for each restart (5: the roll's 4, the interrupted one's),
    # and no death report: each broker's end was a restart's.
    assert sum("stopping for `metactl roll` (controlled shutdown)" in x for x in out) == 5
    assert sum("started again by `metactl roll`" in x for x in out) == 5
    assert not any(x.startswith("!! broker") for x in out), out

    # Every ISR the controller committed up to the end of the roll held MinISR members.
    dump = metactl(
        "log", "dump", "--data-dir", str(data), "--type", "Partition,PartitionChange",
        "--to", str(committed + 1), "--json", cwd=tmp_path,
    )  # fmt: skip
    assert dump.returncode == 0, dump.stderr
    isrs = [json.loads(x) for x in dump.stdout.splitlines()]
    changes = [x for x in isrs if x["topic"] == TOPIC and x.get("isr") is not None]
    assert len(changes) > 6 + 4 * 4  # the creation, then each step's shrinks and regrowth
    assert min(len(x["isr"]) for x in changes) >= MIN_ISR, [
        (x["offset"], x["partition"], x["isr"]) for x in changes if len(x["isr"]) < MIN_ISR
    ]


def test_a_roll_that_no_order_allows_restarts_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    # Two brokers, the demo topic at RF 2 and MinISR 2: either broker's shutdown takes
    # each partition below MinISR.
    up = Up(data, "--brokers", "2", "--insecure", "--min-isr", "2")
    try:
        first = pids(up.await_banner())
        up.lines()  # read from now on: a full pipe would stall cluster up
        r = metactl("roll", "--data-dir", str(data), cwd=tmp_path)
        assert r.returncode == 3, r.stdout + r.stderr
        lines = r.stdout.splitlines()
        assert lines[0] == (
            "Roll refused: broker(s) 1, 2 cannot be restarted without taking a partition "
            "below MinISR, in any order: nothing was restarted."
        )
        blocked = lines.index(
            "BLOCKED: broker(s) 1,2 cannot be restarted without taking a partition below "
            "MinISR, in any order; 2 partition(s) block:"
        )
        table = [x.split() for x in lines[blocked + 1 :]]
        assert table[0] == ["PARTITION", "MINISR", "LEADER", "REPLICAS", "ISR", "BLOCKS"]
        assert sorted(row[0] for row in table[1:3]) == ["demo-0", "demo-1"]
        assert all(row[1] == "2" and row[5] == "1,2" for row in table[1:3]), table
        # --json: the same verdict, the plan's blocking partitions as data.
        r = metactl("roll", "--data-dir", str(data), "--json", cwd=tmp_path)
        assert r.returncode == 3, r.stderr
        doc = json.loads(r.stdout)
        assert doc["done"] is False and doc["steps"] == []
        assert doc["blocked"]["blocked"] == [1, 2] and doc["blocked"]["blocking_count"] == 2
        # One broker alone is blocked too; a broker the cluster lacks is a usage error,
        # at the command and at cluster up's control socket.
        r = metactl("roll", "--data-dir", str(data), "--brokers", "2", cwd=tmp_path)
        assert r.returncode == 3 and r.stdout.startswith("Roll refused: broker(s) 2 cannot")
        r = metactl("roll", "--data-dir", str(data), "--brokers", "1,9", cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        assert r.stderr == (
            "error: INVALID_CONFIG: --brokers: the cluster has no broker 9 (its brokers: 1, 2)\n"
        )
        with pytest.raises(InvalidConfigurationError, match="there is no broker 9 to restart"):
            ask(data, {"restart_broker": 9}, BOUND_S)
        # Nothing was restarted.
        assert recorded_pids(data) == {1: first["broker 1"], 2: first["broker 2"]}
        assert all(alive(pid) for pid in first.values())
    finally:
        status = up.stop()
    assert status == 0
    out: list[str] = []
    read_lines(up, out)
    assert not any("metactl roll" in x for x in out), out


def test_the_roll_needs_a_running_cluster_up(tmp_path: Path) -> None:
    r = metactl("roll", "--data-dir", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 5, r.stderr
    assert r.stderr.startswith(
        f"error: NETWORK_EXCEPTION: no `metactl cluster up` is running on {tmp_path.resolve()}"
    )
    (tmp_path / RECORD_FILE).write_text(json.dumps({"pid": 2**22 + 1, "controllers": []}))
    r = metactl("roll", "--data-dir", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 5 and "is gone" in r.stderr, r.stderr
