"""Large-cluster benchmarks (issues 11 and 20): nothing wedges the controller.

(a) Fence one broker hosting 1,000,000 partitions (3 brokers, RF 3) on a real SQLite log.
    Before metadata transactions its 115 MB of records were one batch over the 64 MiB
    limit, so the commit failed for ever. Prints the time until the fence is durable and
    applied, the step and append times, how many batches the transaction took, and how
    long a restart takes to replay the log with it.
(b) Describe and heartbeat latency while a 100,000-partition topic is created, through
    the real controller service over TCP (a `python -m controller` process, `--insecure`,
    the per-request partition cap and mutation quota lifted for the run): 20 connections
    each send a registered broker's heartbeat every 100 ms (staggered), and an operator
    connection sends `DescribeCluster(topic=small)` (what `metactl describe --topic
    small` sends) every 20 ms, before (idle, 3 s) and during the create. Each request is
    timed from when it was due, so a stall counts for every request it held back.
    p50 / p99 / max, with the goal (p99 ≤ 100 ms).
(c) The same create in-process on the driver, sliced (the default) and unsliced (what
    the controller did before), with the same 20 heartbeat sessions: heartbeat latency
    and the create's time, so the cost and the benefit of slicing show side by side.

(t) Issue 20's two topologies through the real controller service (a `python -m
    controller` process on a seeded SQLite log, `--insecure`, session timeout 3 s), with
    the healthy brokers heartbeating every 200 ms and an operator describing every 100 ms
    all along, each request timed from when it was due. offline: N partitions whose only
    replica is broker 1; broker 1 is killed (its heartbeats stop), the fence commits, it
    restarts cleanly and every partition is led again, it is killed again, and restarts
    uncleanly: every partition is recovered from its log (a GetReplicaLogInfo listener
    answers for broker 1). moving: N partitions at RF 3 on brokers 1-3, broker 1 leading
    all; it is killed (leadership moves), restarts cleanly, rejoins every ISR (broker 2's
    batched AlterPartitions) and a bulk preferred election (ElectPreferredLeaders) moves
    leadership back. Prints the time of each
    phase, heartbeat and describe p99/max, healthy brokers fenced and the controller's
    peak RSS; `--json` prints one object with the worst of the two.
(r) Bounded requests (issue 30, item 6): on a seeded log of N partitions (RF 3 on brokers
    1-3, broker 4 empty), with brokers 1-4 heartbeating every 200 ms and an operator
    describing every 100 ms (session timeout 3 s), the largest legal request of each
    lifecycle type, one after the other: a reassignment of the cap's partitions, its
    --list (paged) and its cancel, a broker's AlterPartitions at the cap, a create at the
    partitions cap and one naming the most topics, an addition of partitions at the
    cap, a delete naming the most topics, a MinISR change and the config-entry cap, an
    ELR downgrade and upgrade (each clearing every topic's ELRs in slices), a bulk
    preferred election of every partition and one naming a frame of partitions, an
    unregistration, a whole metadata fetch and a v1 describe. Prints each request's time
    and whether its answer was readable, heartbeat p99/max per request and healthy
    brokers fenced (goals: p99 <= 250 ms, max <= 1 s, 0 fenced, every answer readable).
(s) A restart on a log of N partitions (`--restart-partitions`, 1,000,000 in the issue)
    all leaderless (broker 1, their only replica, fenced): the controller starts, and a
    healthy broker heartbeats every 200 ms from the moment it serves (its READY line)
    for 20 s while recovery evaluation looks at every partition. Prints the time to
    serve, the first heartbeat's answer after serving and the heartbeats' max (goals:
    <= 1 s each).

Run: python bench/large_cluster.py [--partitions 1000000] [--json] [--sections t,a,b,c]
     [--fence-partitions 1000000] [--create-partitions 100000]
     [--sections r,s --partitions 300000 --restart-partitions 1000000]
Prints figures and ratios; asserts nothing. Needs about 4 GiB of memory for (a).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from controller_ops import CONFIG, cluster_records, peak_rss_mib

from brokers_stub.leader import MAX_ALTER_ITEMS
from controller.core.work import WORK_BUDGET as CREATE_SLICE_PARTITIONS
from controller.runtime.clock import SystemClock
from controller.runtime.driver import Controller
from controller.runtime.loading import load_image
from controller.runtime.process import freeze_heap
from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from metadata_log.records import (
    MAX_BATCH_BYTES,
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
)
from metadata_log.sqlite_format import resolve_log_path
from metadata_log.sqlite_store import SqliteLogStore
from protocol.client import RpcClient
from protocol.messages.admin import (
    AlterConfigs,
    AlterPartitionReassignments,
    CreatePartitions,
    CreatePartitionsRequest,
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DescribeClusterRequest,
    ElectPreferredLeaders,
    ElectPreferredLeadersResponse,
    ListPartitionReassignmentsRequest,
    Reassignment,
    UnregisterBroker,
    UpdateFeature,
)
from protocol.messages.broker_controller import (
    AlterPartition,
    AlterPartitions,
    AlterPartitionsResponse,
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    FetchMetadataRequest,
    GetReplicaLogInfoRequest,
    GetReplicaLogInfoResponse,
    IsrMember,
    RegisterBroker,
    RegisterBrokerResponse,
    ReplicaLogInfoEntry,
    ReplicaRef,
)
from protocol.messages.internal import FenceBroker, UnfenceBroker
from protocol.messages.unions import Message

GOAL_MS = 100.0
DESCRIBE = DescribeClusterRequest(topic="small")  # what `metactl describe --topic small` sends
SESSIONS = 20  # heartbeat connections, each one broker session's heartbeats
HEARTBEAT_PERIOD_S = 0.1  # per session (Kafka brokers: 2 s; 20 x 10/s for the samples)
DESCRIBE_PERIOD_S = 0.02


def pct(xs: list[float], q: int) -> float:
    if not xs:
        return float("nan")
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else xs[0]


def summary(xs: list[float]) -> str:
    return (
        f"n={len(xs):5d}  p50 {pct(xs, 50):7.2f} ms  p99 {pct(xs, 99):7.2f} ms  "
        f"max {max(xs, default=float('nan')):7.2f} ms"
    )


# --- (a) the fence ---------------------------------------------------------------------


def batches_from(path: Path, start: int) -> tuple[int, int, int]:
    """(batches, payload bytes, largest payload) stored at or after offset `start`."""
    conn = sqlite3.connect(resolve_log_path(path).resolve().as_uri() + "?mode=ro", uri=True)
    try:
        row = conn.execute(
            "SELECT count(*), sum(length(payload)), max(length(payload)) FROM batches "
            "WHERE base_offset >= ?",
            (start,),
        ).fetchone()
    finally:
        conn.close()
    return int(row[0]), int(row[1] or 0), int(row[2] or 0)


async def bench_fence(partitions: int, tmp: Path) -> None:
    seed = cluster_records(3, partitions)
    image = replay(ClusterImage(), seed)
    store = await SqliteLogStore.open(tmp / "fence")
    for i in range(0, len(seed), 50_000):
        await store.append(seed[i : i + 50_000], timestamp_ms=0)
    del seed
    ctl = Controller(store, image, config=CONFIG)
    ctl.start()
    processing: list[float] = []
    appends: list[tuple[float, int]] = []
    ctl.event_listeners.append(lambda name, queued, took: processing.append(took))
    ctl.append_listeners.append(lambda seconds, n: appends.append((seconds, n)))
    freeze_heap()
    start = store.end_offset
    began = time.perf_counter()
    await ctl.submit(FenceBroker(broker_id=0))
    took = time.perf_counter() - began
    records = store.end_offset - start
    batches, size, largest = batches_from(tmp / "fence", start)
    first = (await store.read(start, 1))[0].record
    last = (await store.read(store.end_offset - 1, 1))[0].record
    print(f"(a) fence 1 of 3 brokers, each hosting {partitions:,} partitions (RF 3):")
    print(
        f"    {took:.2f} s until durable and applied: step {sum(processing):.2f} s, "
        f"{len(appends)} appends {sum(s for s, _ in appends):.2f} s"
    )
    print(
        f"    {records:,} records, {size:,} payload bytes in {batches} batches "
        f"(largest {largest:,} bytes; limit {MAX_BATCH_BYTES:,}), "
        f"{type(first).__name__} ... {type(last).__name__}"
    )
    print(
        f"    fenced: {ctl.committed_image.brokers[0].fenced}, "
        f"committed image at the log end: {ctl.committed_image.end_offset == store.end_offset}"
    )
    await ctl.close()
    await store.close()
    del ctl, image
    # The restart loop: a restart now replays the transaction like any change.
    began = time.perf_counter()
    store = await SqliteLogStore.open(tmp / "fence")
    restarted = await load_image(store)
    took = time.perf_counter() - began
    print(
        f"    restart: log replayed in {took:.2f} s (no snapshot), broker 0 fenced: "
        f"{restarted.brokers[0].fenced}, image at the log end: "
        f"{restarted.end_offset == store.end_offset}"
    )
    await store.close()


# --- (b) describe and heartbeats over TCP ----------------------------------------------


def start_controller(
    data_dir: Path, *flags: str, session_ms: int = 600_000
) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """A `python -m controller` process (--insecure, quota and request cap lifted) and the
    fields of its READY line (listen=..., metrics=... when asked for)."""
    cmd = [sys.executable, "-m", "controller", "--data-dir", str(data_dir),
           "--listen", "127.0.0.1:0", "--insecure", "--session-timeout-ms", str(session_ms),
           *flags, "--log-level", "WARNING", "--max-partitions-per-request", "100000000",
           "--controller-mutation-rate", "0"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("the controller exited early")
        if line.startswith("READY"):
            return proc, dict(f.split("=", 1) for f in line.split()[2:])


async def paced(
    send: Callable[[], Awaitable[object]],
    period: float,
    offset: float,
    stop: asyncio.Event,
    out: list[float],
) -> None:
    """`send()` every `period` seconds (first after `offset`), one at a time, each timed
    from when it was due: a stall counts for every request it held back, not only for the
    one in flight (no coordinated omission)."""
    due = time.perf_counter() + offset
    while not stop.is_set():
        wait = due - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)  # the schedule: pacing, not synchronisation
        await send()
        out.append((time.perf_counter() - due) * 1000)
        due += period


async def probes_during(
    address: str, heartbeats: list[Message], work: asyncio.Future[float] | None, idle_s: float
) -> tuple[list[float], list[float]]:
    """Heartbeat and describe latencies until `work` is done (or for `idle_s`): one
    connection per heartbeat session (each every HEARTBEAT_PERIOD_S, staggered) and one
    operator connection describing every DESCRIBE_PERIOD_S."""
    clients = [RpcClient(address) for _ in range(len(heartbeats) + 1)]
    stop = asyncio.Event()
    hbs: list[float] = []
    describes: list[float] = []
    tasks = []
    for i, (client, beat) in enumerate(zip(clients, heartbeats, strict=False)):

        def send(c: RpcClient = client, m: Message = beat) -> Awaitable[Message]:
            return c.request(m, timeout_s=120)

        offset = HEARTBEAT_PERIOD_S * i / len(heartbeats)
        tasks.append(asyncio.create_task(paced(send, HEARTBEAT_PERIOD_S, offset, stop, hbs)))

    def describe() -> Awaitable[Message]:
        return clients[-1].request(DESCRIBE, timeout_s=120)

    tasks.append(asyncio.create_task(paced(describe, DESCRIBE_PERIOD_S, 0, stop, describes)))
    try:
        if work is None:
            await asyncio.sleep(idle_s)  # the measuring window itself
        else:
            await work
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        for client in clients:
            await client.close()
    return hbs, describes


async def bench_service(partitions: int, tmp: Path) -> None:
    proc, ready = start_controller(tmp / "service")
    address = ready["listen"]
    try:
        admin = RpcClient(address)
        epochs = {}
        for b in (1, 2, 3):
            r = await admin.request(RegisterBroker(broker_id=b, incarnation_id=f"b{b}"))
            assert isinstance(r, RegisterBrokerResponse)
            epochs[b] = r.broker_epoch
            await admin.request(
                BrokerHeartbeatRequest(
                    broker_id=b, broker_epoch=r.broker_epoch, metadata_offset=r.broker_epoch + 1
                )
            )
        small = CreateTopic(name="small", partitions=6, replication_factor=3)
        await admin.request(CreateTopicsRequest(topics=[small]))
        beats: list[Message] = [
            BrokerHeartbeatRequest(
                broker_id=b, broker_epoch=epochs[b], metadata_offset=epochs[b] + 1
            )
            for b in (1 + i % 3 for i in range(SESSIONS))
        ]
        idle_hb, idle_describe = await probes_during(address, beats, None, 3.0)
        huge = CreateTopic(name="huge", partitions=partitions, replication_factor=3)

        async def create() -> float:
            t = time.perf_counter()
            r = await admin.request(CreateTopicsRequest(topics=[huge]), timeout_s=600)
            assert isinstance(r, CreateTopicsResponse) and r.results[0].error_code is None, r
            return time.perf_counter() - t

        work = asyncio.ensure_future(create())
        hbs, describes = await probes_during(address, beats, work, 0)
        took = work.result()
        await admin.close()
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
    print(f"(b) service over TCP, a {partitions:,}-partition create took {took:.2f} s; meanwhile:")
    print(f"    heartbeat  {summary(hbs)}  (goal p99 ≤ {GOAL_MS:.0f} ms)")
    print(f"    describe   {summary(describes)}  (goal p99 ≤ {GOAL_MS:.0f} ms)")
    print(f"    idle, before it: heartbeat p99 {pct(idle_hb, 99):.2f} ms, describe p99 "
          f"{pct(idle_describe, 99):.2f} ms; ratio during/idle p99: heartbeat "
          f"{pct(hbs, 99) / pct(idle_hb, 99):.1f}x, describe "
          f"{pct(describes, 99) / pct(idle_describe, 99):.1f}x")  # fmt: skip


# --- (c) sliced against unsliced, in-process -------------------------------------------


async def bench_in_process(
    partitions: int, slice_partitions: int | None, tmp: Path
) -> tuple[float, list[float]]:
    store = await SqliteLogStore.open(tmp)
    ctl = await Controller.open(
        store, config=CONFIG, clock=SystemClock(), work_budget=slice_partitions
    )
    for b in (1, 2, 3):
        r = await ctl.submit(RegisterBroker(broker_id=b, incarnation_id=f"b{b}"))
        assert isinstance(r, RegisterBrokerResponse)
        await ctl.submit(UnfenceBroker(broker_id=b, broker_epoch=r.broker_epoch))
    freeze_heap()
    stop = asyncio.Event()
    latencies: list[float] = []
    tasks = []
    for i in range(SESSIONS):
        b = 1 + i % 3
        epoch = ctl.image.brokers[b].epoch
        beat = BrokerHeartbeatRequest(broker_id=b, broker_epoch=epoch, metadata_offset=epoch + 1)

        async def send(m: BrokerHeartbeatRequest = beat) -> None:
            r = await ctl.submit(m)
            assert isinstance(r, BrokerHeartbeatResponse)

        offset = HEARTBEAT_PERIOD_S * i / SESSIONS
        tasks.append(asyncio.create_task(paced(send, HEARTBEAT_PERIOD_S, offset, stop, latencies)))
    await asyncio.sleep(HEARTBEAT_PERIOD_S)  # every session under way: pacing
    t = time.perf_counter()
    await ctl.submit(CreateTopic(name="huge", partitions=partitions, replication_factor=3))
    took = time.perf_counter() - t
    stop.set()
    await asyncio.gather(*tasks)
    await ctl.close()
    await store.close()
    return took, latencies


async def bench_slicing(partitions: int, tmp: Path) -> None:
    rows = []
    for label, size in (
        ("unsliced", None),
        (f"slices of {CREATE_SLICE_PARTITIONS:,}", CREATE_SLICE_PARTITIONS),
    ):
        took, lat = await bench_in_process(partitions, size, tmp / f"inproc-{size}")
        rows.append((label, took, lat))
    print(f"(c) in-process driver, a {partitions:,}-partition create with a heartbeat loop:")
    for label, took, lat in rows:
        print(f"    {label:18s} create {took:6.2f} s; heartbeat {summary(lat)}")
    (_, t0, l0), (_, t1, l1) = rows
    print(f"    sliced/unsliced: create time {t1 / t0:.2f}x, heartbeat p99 "
          f"{pct(l1, 99) / pct(l0, 99):.3f}x, max {max(l1) / max(l0):.3f}x")  # fmt: skip


# --- (t) the two topologies of issue 20, through the real service ----------------------

TOPOLOGY_SESSION_MS = 3_000  # the controller's session timeout for the run
HEALTHY_PERIOD_S = 0.2  # each healthy broker heartbeats this often
DESCRIBE_EVERY_S = 0.1
GOAL_P99_MS, GOAL_MAX_MS, GOAL_RSS_MIB = 250.0, 1_000.0, 1_536.0


def topology_records(kind: str, partitions: int) -> tuple[list[MetadataRecord], list[int]]:
    """The seeded log: brokers registered and unfenced (broker b's epoch is its record's
    offset), topics of up to 10,000 partitions, and a 3-partition `small` topic for the
    describe probe. offline: broker 1 holds every replica (RF 1, MinISR 1); moving: RF 3
    on brokers 1-3, broker 1 first in every assignment (so leader and preferred)."""
    brokers = [1, 2] if kind == "offline" else [1, 2, 3]
    out: list[MetadataRecord] = []
    for i, b in enumerate(brokers):
        out.append(RegisterBrokerRecord(broker_id=b, incarnation_id=f"b{b}-0", broker_epoch=2 * i))
        out.append(UnfenceBrokerRecord(broker_id=b, broker_epoch=2 * i))
    replicas = [1] if kind == "offline" else [1, 2, 3]
    min_isr = 1 if kind == "offline" else 2
    per_topic = 10_000
    for t in range(0, partitions, per_topic):
        n = min(per_topic, partitions - t)
        name = f"t{t // per_topic:04d}"
        out.append(TopicRecord(name=name, topic_id=name, partitions=n, min_isr=min_isr))
        out.extend(
            PartitionRecord(topic=name, partition=i, replicas=replicas, isr=replicas,
                            leader=1, min_isr=min_isr)
            for i in range(n)
        )  # fmt: skip
    healthy = brokers[1:]
    out.append(TopicRecord(name="small", topic_id="small", partitions=3, min_isr=1))
    for i in range(3):
        h = healthy[i % len(healthy)]
        out.append(PartitionRecord(topic="small", partition=i, replicas=[h], isr=[h], leader=h))
    return out, [2 * i for i in range(len(brokers))]


async def seed_log(path: Path, records: list[MetadataRecord]) -> None:
    store = await SqliteLogStore.open(path)
    try:
        for i in range(0, len(records), 50_000):
            await store.append(records[i : i + 50_000], timestamp_ms=0)
    finally:
        await store.close()


def scrape(metrics: str) -> dict[str, float]:
    """The controller's /metrics, as {name{labels}: value} (plain HTTP with --insecure)."""
    import urllib.request

    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[name] = float(value)
    return out


def profile_process(pid: int, label: str) -> subprocess.Popen[bytes] | None:
    """With METACTL_BENCH_PROFILE=DIR, sample the controller with py-spy (if installed)
    into DIR/<label>.txt (collapsed stacks, idle frames left out): profile first."""
    import os
    import shutil

    out = os.environ.get("METACTL_BENCH_PROFILE")
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not out or not Path(spy).exists():
        return None
    Path(out).mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--rate", "200", "--format", "raw",
         "--output", str(Path(out) / f"{label}.txt")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


class LogInfoBroker:
    """Broker 1's GetReplicaLogInfo listener: every replica asked for answers with the
    same log end (it is the only replica, so it is chosen), for the unclean restart."""

    def __init__(self) -> None:
        from protocol.server import FrameServer

        self.asked = 0
        self.server = FrameServer(self.handle)

    async def handle(self, body: Message, peer: object) -> Message:
        assert isinstance(body, GetReplicaLogInfoRequest)
        self.asked += len(body.partitions)
        return GetReplicaLogInfoResponse(
            broker_id=1,
            broker_epoch=body.broker_epoch,
            partitions=[
                ReplicaLogInfoEntry(topic=r.topic, partition=r.partition, log_end_offset=100)
                for r in body.partitions
            ],
        )


class Tagged(list[float]):
    """Latencies, each also noted under the phase it was due in."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = "idle"
        self.by_phase: dict[str, list[float]] = {}

    def append(self, ms: float) -> None:
        super().append(ms)
        self.by_phase.setdefault(self.phase, []).append(ms)


class Probes:
    """The healthy brokers' heartbeats and an operator's describes, paced, each timed
    from when it was due. Counts the healthy
    heartbeats answered 'fenced' (or refused as not registered at that epoch)."""

    def __init__(self, address: str, healthy: dict[int, int]) -> None:
        self.address = address
        self.healthy = healthy
        self.heartbeats = Tagged()
        self.describes = Tagged()
        self.healthy_fenced = 0
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        self.clients: list[RpcClient] = []

    def start(self) -> None:
        for i, (b, epoch) in enumerate(sorted(self.healthy.items())):
            client = RpcClient(self.address)
            self.clients.append(client)
            beat = BrokerHeartbeatRequest(broker_id=b, broker_epoch=epoch, metadata_offset=1 << 40)

            async def send(c: RpcClient = client, m: Message = beat) -> None:
                r = await c.request(m, timeout_s=120)
                if not isinstance(r, BrokerHeartbeatResponse) or r.is_fenced:
                    self.healthy_fenced += 1

            offset = HEALTHY_PERIOD_S * i / len(self.healthy)
            self.tasks.append(
                asyncio.create_task(
                    paced(send, HEALTHY_PERIOD_S, offset, self.stop, self.heartbeats)
                )
            )
        operator = RpcClient(self.address)
        self.clients.append(operator)

        async def describe() -> None:
            await operator.request(DESCRIBE, timeout_s=120)

        self.tasks.append(
            asyncio.create_task(paced(describe, DESCRIBE_EVERY_S, 0, self.stop, self.describes))
        )

    def enter(self, phase: str) -> None:
        self.heartbeats.phase = self.describes.phase = phase

    async def close(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for c in self.clients:
            await c.close()


def _probe_process(address: str, healthy: dict[int, int], conn: Any) -> None:
    """The measured probes, in a process of their own (spawned), so that nothing the
    bench's own process does (seeding, scraping, broker 1's heartbeats) delays them.
    Messages: ("phase", name), ("stop",); it answers "ready", then the results."""

    async def main() -> None:
        probes = Probes(address, healthy)
        probes.start()
        stopped = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_message() -> None:
            while conn.poll():
                msg = conn.recv()
                if msg[0] == "phase":
                    probes.enter(msg[1])
                else:
                    stopped.set()

        loop.add_reader(conn.fileno(), on_message)
        conn.send("ready")
        await stopped.wait()
        loop.remove_reader(conn.fileno())
        await probes.close()
        conn.send(
            {
                "heartbeats": list(probes.heartbeats),
                "describes": list(probes.describes),
                "heartbeat_by_phase": probes.heartbeats.by_phase,
                "describe_by_phase": probes.describes.by_phase,
                "healthy_fenced": probes.healthy_fenced,
            }
        )

    asyncio.run(main())


class Broker1:
    """Broker 1's own heartbeats (not measured), every 500 ms while it is 'alive'."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.task: asyncio.Task[None] | None = None

    def alive(self, epoch: int | None) -> None:
        """Heartbeat at `epoch` from now on (None: it is 'killed')."""
        if self.task is not None:
            self.task.cancel()
            self.task = None
        if epoch is not None:
            self.task = asyncio.create_task(self._beat(epoch))

    async def _beat(self, epoch: int) -> None:
        beat = BrokerHeartbeatRequest(broker_id=1, broker_epoch=epoch, metadata_offset=1 << 40)
        async with RpcClient(self.address) as c:
            while True:
                with contextlib.suppress(Exception):
                    await c.request(beat, timeout_s=120)
                await asyncio.sleep(0.5)  # broker 1's heartbeat interval


class ProbeProcess:
    """`Probes` run by `_probe_process`, driven from the bench's event loop."""

    def __init__(self, address: str, healthy: dict[int, int]) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_probe_process, args=(address, healthy, child))
        self.results: dict[str, Any] = {}

    async def start(self) -> None:
        self.proc.start()
        assert await asyncio.to_thread(self.conn.recv) == "ready"

    def enter(self, phase: str) -> None:
        self.conn.send(("phase", phase))

    async def close(self) -> dict[str, Any]:
        if not self.results and self.proc.is_alive():
            self.conn.send(("stop",))
            self.results = await asyncio.to_thread(self.conn.recv)
            await asyncio.to_thread(self.proc.join, 60)
        return self.results


async def wait_metrics(metrics: str, what: str, test: Callable[[dict[str, float]], bool]) -> float:
    """Scrape every 250 ms until `test` holds; the seconds it took."""
    began = time.perf_counter()
    while True:
        m = await asyncio.to_thread(scrape, metrics)
        if test(m):
            return time.perf_counter() - began
        if time.perf_counter() - began > 1800:
            raise RuntimeError(f"gave up waiting for {what}")
        await asyncio.sleep(0.25)  # a poll of the controller's own gauges


def fenced(m: dict[str, float]) -> float:
    return m.get('metactl_brokers{state="fenced"}', 0)


async def register_broker1(address: str, endpoint: str, previous: int | None) -> int:
    async with RpcClient(address) as c:
        r = await c.request(
            RegisterBroker(
                broker_id=1, incarnation_id=f"b1-{time.monotonic_ns()}", endpoint=endpoint,
                previous_epoch=previous,
            ),
            timeout_s=600,
        )  # fmt: skip
    assert isinstance(r, RegisterBrokerResponse), r
    return r.broker_epoch


async def rejoin_isrs(address: str, partitions: int, epochs: list[int], epoch1: int) -> int:
    """Broker 1 back into the ISR of each of the moving topology's partitions, in the
    batched AlterPartitions that broker 2, their leader after the fence, sends (one
    request in flight, `MAX_ALTER_ITEMS` items each, as brokers_stub.leader does). The
    states are the fence's: leader 2, leader and partition epoch 1, ISR [2, 3]. Returns
    the items refused."""
    members = [
        IsrMember(broker_id=1, broker_epoch=epoch1),
        IsrMember(broker_id=2, broker_epoch=epochs[1]),
        IsrMember(broker_id=3, broker_epoch=epochs[2]),
    ]
    refused = 0
    names = [(t, min(10_000, partitions - t)) for t in range(0, partitions, 10_000)]
    items = (
        AlterPartition(
            topic=f"t{t // 10_000:04d}", partition=i, leader=2, broker_epoch=epochs[1],
            partition_epoch=1, leader_epoch=1, isr=members,
        )
        for t, n in names
        for i in range(n)
    )  # fmt: skip
    async with RpcClient(address) as c:
        while batch := list(itertools.islice(items, MAX_ALTER_ITEMS)):
            r = await c.request(AlterPartitions(items=batch), timeout_s=600)
            assert isinstance(r, AlterPartitionsResponse), r
            refused += sum(1 for x in r.results if x.error_code is not None)
    return refused


async def bench_topology(kind: str, partitions: int, tmp: Path) -> dict[str, object]:
    records, epochs = topology_records(kind, partitions)
    data = tmp / f"topology-{kind}"
    t = time.perf_counter()
    await seed_log(data, records)
    seeded = time.perf_counter() - t
    del records
    freeze_heap()  # no full collection over the seeding's leftovers during the run
    proc, ready = start_controller(
        data,
        "--metrics", "127.0.0.1:0", "--heartbeat-interval-ms", "500",
        session_ms=TOPOLOGY_SESSION_MS,
    )  # fmt: skip
    address, metrics = ready["listen"], ready["metrics"]
    profiler = profile_process(proc.pid, kind)
    phases: dict[str, float] = {"seed_log_s": seeded}
    healthy = {b: epochs[b - 1] for b in range(2, len(epochs) + 1)}
    probes = ProbeProcess(address, healthy)
    broker1 = Broker1(address)
    info = LogInfoBroker()
    await info.server.start("127.0.0.1:0")
    try:
        broker1.alive(epochs[0])
        await probes.start()
        await asyncio.sleep(2.0)  # an idle window before the first fault
        # Kill broker 1: its session expires, and the fence commits.
        probes.enter("kill")
        broker1.alive(None)
        phases["kill_to_fence_committed_s"] = await wait_metrics(
            metrics, "the fence", lambda m: fenced(m) >= 1
        )
        if kind == "offline":
            assert scrape(metrics)["metactl_offline_partitions"] == partitions
        # A clean restart: the registration presents the epoch, heartbeats unfence it.
        probes.enter("clean_restart")
        t = time.perf_counter()
        epoch = await register_broker1(address, info.server.address, epochs[0])
        broker1.alive(epoch)
        if kind == "offline":
            await wait_metrics(
                metrics, "leaders again", lambda m: m["metactl_offline_partitions"] == 0
            )
        else:
            await wait_metrics(metrics, "broker 1 unfenced", lambda m: fenced(m) == 0)
        phases["clean_restart_to_led_s"] = time.perf_counter() - t
        if kind == "moving":
            # Broker 1 back in every ISR, as broker 2 (the leader now) asks in batched
            # AlterPartitions, then a bulk preferred election moves leadership back.
            probes.enter("isr_rejoin")
            t = time.perf_counter()
            refused = await rejoin_isrs(address, partitions, epochs, epoch)
            phases["isr_rejoin_s"] = time.perf_counter() - t
            phases["isr_rejoin_refused"] = refused
            probes.enter("preferred_election")
            t = time.perf_counter()
            async with RpcClient(address) as c:
                r = await c.request(ElectPreferredLeaders(), timeout_s=1800)
            assert isinstance(r, ElectPreferredLeadersResponse), r
            phases["preferred_election_s"] = time.perf_counter() - t
            phases["preferred_elected"] = r.elected
        if kind == "offline":
            # Kill it again, and restart it uncleanly: every partition is recovered from
            # its only replica (balanced: ELR -> LastKnownELR, inspection, recovery).
            probes.enter("second_kill")
            broker1.alive(None)
            phases["second_kill_to_fence_committed_s"] = await wait_metrics(
                metrics, "the second fence", lambda m: fenced(m) >= 1
            )
            probes.enter("unclean_restart")
            t = time.perf_counter()
            epoch = await register_broker1(address, info.server.address, None)
            broker1.alive(epoch)
            await wait_metrics(
                metrics, "recoveries", lambda m: m["metactl_offline_partitions"] == 0
            )
            phases["unclean_restart_to_recovered_s"] = time.perf_counter() - t
            phases["inspected_partitions"] = info.asked
        probes.enter("after")
        await asyncio.sleep(1.0)  # a last window of probes after the work
    finally:
        results = await probes.close()
        broker1.alive(None)
        await info.server.stop()
        rss = peak_rss_mib(proc.pid)
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)  # py-spy writes its profile and exits
            profiler.wait(60)
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(60)
    heartbeats: list[float] = results["heartbeats"]
    describes: list[float] = results["describes"]
    return {
        "topology": kind,
        "partitions": partitions,
        "heartbeat_p99_ms": round(pct(heartbeats, 99), 1),
        "heartbeat_max_ms": round(max(heartbeats, default=float("nan")), 1),
        "describe_p99_ms": round(pct(describes, 99), 1),
        "describe_max_ms": round(max(describes, default=float("nan")), 1),
        "healthy_fenced": results["healthy_fenced"],
        "peak_rss_mib": round(rss, 1),
        "heartbeats": len(heartbeats),
        "describes": len(describes),
        **{k: round(v, 2) for k, v in phases.items()},
        "heartbeat_by_phase": {
            k: f"p99 {pct(v, 99):.1f} max {max(v):.1f} ms"
            for k, v in results["heartbeat_by_phase"].items()
        },
        "describe_by_phase": {
            k: f"p99 {pct(v, 99):.1f} max {max(v):.1f} ms"
            for k, v in results["describe_by_phase"].items()
        },
    }


def bench_topologies(
    partitions: int, tmp: Path, as_json: bool, kinds: tuple[str, ...] = ("offline", "moving")
) -> None:
    results = [asyncio.run(bench_topology(kind, partitions, tmp)) for kind in kinds]
    worst = {
        "partitions": partitions,
        "heartbeat_p99_ms": max(r["heartbeat_p99_ms"] for r in results),  # type: ignore[type-var]
        "heartbeat_max_ms": max(r["heartbeat_max_ms"] for r in results),  # type: ignore[type-var]
        "describe_p99_ms": max(r["describe_p99_ms"] for r in results),  # type: ignore[type-var]
        "healthy_fenced": sum(r["healthy_fenced"] for r in results),  # type: ignore[misc]
        "peak_rss_mib": max(r["peak_rss_mib"] for r in results),  # type: ignore[type-var]
        "topologies": results,
    }
    if as_json:
        print(json.dumps(worst))
        return
    print(f"(t) {partitions:,} partitions through the real service, broker 1 killed and "
          f"restarted; healthy brokers heartbeat every {HEALTHY_PERIOD_S * 1000:.0f} ms, "
          f"describe every {DESCRIBE_EVERY_S * 1000:.0f} ms:")  # fmt: skip
    for r in results:
        shown = [f"{k} {v}" for k, v in r.items() if k not in ("topology", "partitions")]
        print(f"    {r['topology']}: " + ", ".join(shown))
    print(f"    worst: heartbeat p99 {worst['heartbeat_p99_ms']} ms (goal ≤ {GOAL_P99_MS:.0f}), "
          f"max {worst['heartbeat_max_ms']} ms (≤ {GOAL_MAX_MS:.0f}); describe p99 "
          f"{worst['describe_p99_ms']} ms; healthy brokers fenced {worst['healthy_fenced']} "
          f"(0); peak RSS {worst['peak_rss_mib']} MiB (≤ {GOAL_RSS_MIB:.0f})")  # fmt: skip


# --- (r) the largest legal request of each lifecycle type --------------------------------


def requests_records(partitions: int) -> tuple[list[MetadataRecord], dict[int, int]]:
    """Brokers 1-4 registered and unfenced (broker 4 hosts nothing), N partitions at RF 3
    on brokers 1-3 (MinISR 2) in topics of 10,000, and the describe probe's `small`."""
    out: list[MetadataRecord] = []
    epochs = {}
    for i, b in enumerate((1, 2, 3, 4)):
        out.append(RegisterBrokerRecord(broker_id=b, incarnation_id=f"b{b}-0", broker_epoch=2 * i))
        out.append(UnfenceBrokerRecord(broker_id=b, broker_epoch=2 * i))
        epochs[b] = 2 * i
    for t in range(0, partitions, 10_000):
        n = min(10_000, partitions - t)
        name = f"t{t // 10_000:04d}"
        out.append(TopicRecord(name=name, topic_id=name, partitions=n, min_isr=2))
        out.extend(
            PartitionRecord(topic=name, partition=i, replicas=[1, 2, 3], isr=[1, 2, 3],
                            leader=1 + i % 3, min_isr=2)
            for i in range(n)
        )  # fmt: skip
    out.append(TopicRecord(name="small", topic_id="small", partitions=3, min_isr=1))
    for i in range(3):
        out.append(PartitionRecord(topic="small", partition=i, replicas=[2], isr=[2], leader=2))
    return out, epochs


def largest_requests(partitions: int, epochs: dict[int, int]) -> list[tuple[str, Message]]:
    """(label, request): the largest legal one of each lifecycle type, in order."""
    from controller.runtime.request_caps import (
        MAX_ALTER_PARTITION_ITEMS,
        MAX_CONFIG_ENTRIES,
        MAX_REASSIGNMENT_ITEMS,
        MAX_TOPICS_PER_REQUEST,
    )

    def tp(k: int) -> tuple[str, int]:
        return f"t{k // 10_000:04d}", k % 10_000

    moving = [tp(k) for k in range(MAX_REASSIGNMENT_ITEMS)]
    isr = [IsrMember(broker_id=b, broker_epoch=epochs[b]) for b in (1, 2, 3)]
    frame_refs = 8 * 1024 * 1024 // 16  # about a frame of [topic, partition] pairs
    return [
        ("reassign", AlterPartitionReassignments(
            reassignments=[Reassignment(topic=t, partition=i, replicas=[2, 3, 4])
                           for t, i in moving])),
        ("list_reassignments", ListPartitionReassignmentsRequest()),  # the CLI's pages
        ("cancel_reassign", AlterPartitionReassignments(
            reassignments=[Reassignment(topic=t, partition=i, replicas=None) for t, i in moving])),
        ("alter_partitions", AlterPartitions(items=[
            AlterPartition(topic=t, partition=i, leader=1, broker_epoch=epochs[1],
                           partition_epoch=99, isr=isr)
            for t, i in map(tp, range(MAX_ALTER_PARTITION_ITEMS))])),
        ("create_topic_10k", CreateTopicsRequest(
            topics=[CreateTopic(name="new", partitions=10_000, replication_factor=3)])),
        ("create_topics_most", CreateTopicsRequest(
            topics=[CreateTopic(name=f"e{i:05d}", partitions=0)
                    for i in range(MAX_TOPICS_PER_REQUEST)])),
        ("create_partitions", CreatePartitionsRequest(
            topics=[CreatePartitions(topic="new", count=20_000)])),
        ("delete_topics_most", DeleteTopicsRequest(
            topics=["new"] + [f"e{i:05d}" for i in range(MAX_TOPICS_PER_REQUEST - 1)])),
        ("min_isr_change", AlterConfigs(
            resource_type="topic", resource_name="t0000",
            set_configs={"min.insync.replicas": "1"})),
        ("configs_most", AlterConfigs(
            resource_type="topic", resource_name="t0000",
            delete_configs=[f"x{i}" for i in range(MAX_CONFIG_ENTRIES)])),
        ("elr_downgrade", UpdateFeature(
            name="eligible.leader.replicas.version", level=0, upgrade_type="downgrade")),
        ("elr_upgrade", UpdateFeature(name="eligible.leader.replicas.version", level=1)),
        ("elect_preferred_all", ElectPreferredLeaders()),
        ("elect_preferred_frame", ElectPreferredLeaders(
            partitions=[ReplicaRef(*tp(k % partitions)) for k in range(frame_refs)])),
        ("unregister", UnregisterBroker(broker_id=5)),
        ("fetch_metadata", FetchMetadataRequest(from_offset=0, max_records=50_000,
                                                max_wait_ms=0)),
        ("describe_v1", DescribeClusterRequest()),
    ]  # fmt: skip


async def bench_requests(partitions: int, tmp: Path) -> dict[str, Any]:
    from clients.admin import ongoing
    from metactl.errors import MetactlError, NetworkError, RequestTimedOutError

    records, epochs = requests_records(partitions)
    data = tmp / "requests"
    await seed_log(data, records)
    del records
    freeze_heap()
    proc, ready = start_controller(
        data, "--heartbeat-interval-ms", "500", session_ms=TOPOLOGY_SESSION_MS
    )
    address = ready["listen"]
    profiler = profile_process(proc.pid, "requests")
    probes = ProbeProcess(address, epochs)
    rows: list[dict[str, Any]] = []
    try:
        await probes.start()
        await asyncio.sleep(1.0)  # an idle window first
        async with RpcClient(address) as c:
            # Broker 5: registered, never unfenced (the unregistration's subject).
            await c.request(RegisterBroker(broker_id=5, incarnation_id="b5"))
            for label, body in largest_requests(partitions, epochs):
                probes.enter(label)
                began = time.perf_counter()
                try:
                    if isinstance(body, ListPartitionReassignmentsRequest):
                        answer: object = f"{len(await ongoing(c, None, 600))} partitions"
                    else:
                        answer = type(await c.request(body, timeout_s=600)).__name__
                    readable = True
                except (NetworkError, RequestTimedOutError) as exc:
                    answer, readable = str(exc)[:120], False
                except MetactlError as exc:
                    answer, readable = f"{exc.code}: {exc.message[:80]}", True
                rows.append({
                    "request": label, "s": round(time.perf_counter() - began, 2),
                    "readable": readable, "answer": answer,
                })  # fmt: skip
            probes.enter("after")
            await asyncio.sleep(1.0)  # a last window of probes after the work
    finally:
        results = await probes.close()
        rss = peak_rss_mib(proc.pid)
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)
            profiler.wait(60)
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(60)
    hb = results["heartbeat_by_phase"]
    for row in rows:
        lat = hb.get(row["request"], [])
        row["heartbeat"] = f"p99 {pct(lat, 99):.1f} max {max(lat, default=0):.1f} ms"
    heartbeats: list[float] = results["heartbeats"]
    return {
        "partitions": partitions,
        "heartbeat_p99_ms": round(pct(heartbeats, 99), 1),
        "heartbeat_max_ms": round(max(heartbeats, default=float("nan")), 1),
        "describe_p99_ms": round(pct(results["describes"], 99), 1),
        "healthy_fenced": results["healthy_fenced"],
        "all_readable": all(r["readable"] for r in rows),
        "peak_rss_mib": round(rss, 1),
        "requests": rows,
    }


def print_requests(r: dict[str, Any]) -> None:
    print(f"(r) the largest legal request of each lifecycle type at {r['partitions']:,} "
          f"partitions; brokers 1-4 heartbeat every {HEALTHY_PERIOD_S * 1000:.0f} ms:")  # fmt: skip
    for row in r["requests"]:
        print(f"    {row['request']:22s} {row['s']:7.2f} s  readable {row['readable']!s:5s} "
              f"heartbeat {row['heartbeat']}  ({row['answer']})")  # fmt: skip
    print(f"    all: heartbeat p99 {r['heartbeat_p99_ms']} ms (goal <= {GOAL_P99_MS:.0f}), max "
          f"{r['heartbeat_max_ms']} ms (<= {GOAL_MAX_MS:.0f}); describe p99 "
          f"{r['describe_p99_ms']} ms; healthy brokers fenced {r['healthy_fenced']} (0); "
          f"every answer readable: {r['all_readable']}; "
          f"peak RSS {r['peak_rss_mib']} MiB")  # fmt: skip


# --- (s) a restart on a log of leaderless partitions ----------------------------------


def restart_records(partitions: int) -> list[MetadataRecord]:
    """The offline topology after broker 1's fence: every partition's only replica is
    broker 1, fenced; each is leaderless with broker 1 in its ELR (MinISR 1)."""
    from metadata_log.records import (
        BROKER_RESOURCE,
        ELR_FEATURE,
        MIN_ISR_CONFIG,
        ConfigRecord,
        FeatureLevelRecord,
        FenceBrokerRecord,
    )

    # A cluster that has run before: bootstrapped (a restart submits nothing before
    # serving, so the first events after it are where recovery evaluation starts).
    out: list[MetadataRecord] = [
        FeatureLevelRecord(name=ELR_FEATURE, level=1),
        ConfigRecord(resource_type=BROKER_RESOURCE, resource_name="", name=MIN_ISR_CONFIG,
                     value="1"),
    ]  # fmt: skip
    for i, b in enumerate((1, 2)):
        epoch = 2 + 2 * i
        out.append(RegisterBrokerRecord(broker_id=b, incarnation_id=f"b{b}-0", broker_epoch=epoch))
        out.append(UnfenceBrokerRecord(broker_id=b, broker_epoch=epoch))
    out.append(FenceBrokerRecord(broker_id=1, broker_epoch=2))
    for t in range(0, partitions, 10_000):
        n = min(10_000, partitions - t)
        name = f"t{t // 10_000:04d}"
        out.append(TopicRecord(name=name, topic_id=name, partitions=n, min_isr=1))
        out.extend(
            PartitionRecord(topic=name, partition=i, replicas=[1], isr=[], elr=[1],
                            leader=-1, leader_epoch=1, partition_epoch=1, min_isr=1)
            for i in range(n)
        )  # fmt: skip
    return out


async def bench_restart(partitions: int, tmp: Path) -> dict[str, Any]:
    data = tmp / "restart"
    t = time.perf_counter()
    await seed_log(data, restart_records(partitions))
    seeded = time.perf_counter() - t
    freeze_heap()
    began = time.perf_counter()
    proc, ready = start_controller(
        data, "--metrics", "127.0.0.1:0", "--heartbeat-interval-ms", "500",
        session_ms=TOPOLOGY_SESSION_MS,
    )  # fmt: skip
    serving = time.perf_counter()
    lat: list[float] = []  # each heartbeat, from when it was due
    first_s = float("nan")
    fenced_answers = 0
    try:
        beat = BrokerHeartbeatRequest(broker_id=2, broker_epoch=4, metadata_offset=1 << 40)
        async with RpcClient(ready["listen"]) as c:
            due = serving
            while time.perf_counter() - serving < 20.0:
                wait = due - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)  # the schedule: pacing
                r = await c.request(beat, timeout_s=120)
                now = time.perf_counter()
                if not lat:
                    first_s = now - serving
                lat.append((now - due) * 1000)
                if not isinstance(r, BrokerHeartbeatResponse) or r.is_fenced:
                    fenced_answers += 1
                due += HEALTHY_PERIOD_S
        offline = scrape(ready["metrics"]).get("metactl_offline_partitions", float("nan"))
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(60)
    return {
        "partitions": partitions,
        "seed_log_s": round(seeded, 1),
        "start_to_serving_s": round(serving - began, 2),
        "first_heartbeat_after_serving_s": round(first_s, 3),
        "heartbeat_p99_ms": round(pct(lat, 99), 1),
        "heartbeat_max_ms": round(max(lat, default=float("nan")), 1),
        "heartbeats": len(lat),
        "fenced_answers": fenced_answers,
        "offline_partitions_at_end": offline,
    }


def main() -> None:
    import logging

    from metactl.logs import configure

    configure(json=False, level=logging.WARNING)
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--partitions", type=int, default=1_000_000, help="(t): partitions of each topology"
    )
    ap.add_argument("--json", action="store_true", help="(t) only, as one JSON object")
    ap.add_argument(
        "--topologies",
        default="offline,moving",
        help="(t): which topologies to run (default offline,moving)",
    )
    ap.add_argument(
        "--sections", default="t,a,b,c", help="which sections to run (default t,a,b,c; also r,s)"
    )
    ap.add_argument("--restart-partitions", type=int, default=1_000_000, help="(s)'s log")
    ap.add_argument("--fence-partitions", type=int, default=1_000_000)
    ap.add_argument("--create-partitions", type=int, default=100_000)
    args = ap.parse_args()
    sections = set(args.sections.split(","))
    with tempfile.TemporaryDirectory(prefix="metactl-bench-") as d:
        tmp = Path(d)
        if "r" in sections:
            r = asyncio.run(bench_requests(args.partitions, tmp))
            if args.json:
                print(json.dumps(r), flush=True)
            print_requests(r)
        if "s" in sections:
            s = asyncio.run(bench_restart(args.restart_partitions, tmp))
            print(f"(s) restart on {args.restart_partitions:,} leaderless partitions: "
                  + ", ".join(f"{k} {v}" for k, v in s.items()), flush=True)  # fmt: skip
        if sections <= {"r", "s"}:
            return
        if "t" in sections or args.json:
            kinds = tuple(k for k in args.topologies.split(",") if k)
            bench_topologies(args.partitions, tmp, args.json, kinds)
        if args.json:
            return
        if "a" in sections:
            asyncio.run(bench_fence(args.fence_partitions, tmp))
        if "b" in sections:
            asyncio.run(bench_service(args.create_partitions, tmp))
        if "c" in sections:
            asyncio.run(bench_slicing(args.create_partitions, tmp))


if __name__ == "__main__":
    main()
