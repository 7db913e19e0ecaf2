"""Large-cluster benchmarks (issue 11): nothing wedges the controller.

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

Run: python bench/large_cluster.py [--fence-partitions 1000000] [--create-partitions 100000]
     [--skip-fence]
Prints figures and ratios; asserts nothing. Needs about 4 GiB of memory for (a).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from controller_ops import CONFIG, cluster_records

from controller.core.work import WORK_BUDGET as CREATE_SLICE_PARTITIONS
from controller.runtime.clock import SystemClock
from controller.runtime.driver import Controller, load_image
from controller.runtime.process import freeze_heap
from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from metadata_log.records import MAX_BATCH_BYTES
from metadata_log.sqlite_format import resolve_log_path
from metadata_log.sqlite_store import SqliteLogStore
from protocol.client import RpcClient
from protocol.messages import (
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeClusterRequest,
    FenceBroker,
    Message,
    RegisterBroker,
    RegisterBrokerResponse,
    UnfenceBroker,
)

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


def start_controller(data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "controller", "--data-dir", str(data_dir),
           "--listen", "127.0.0.1:0", "--insecure", "--session-timeout-ms", "600000",
           "--log-level", "WARNING", "--max-partitions-per-request", "100000000",
           "--controller-mutation-rate", "0"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("the controller exited early")
        if line.startswith("READY"):
            return proc, line.split("listen=")[1].split()[0]


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
    proc, address = start_controller(tmp / "service")
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


def main() -> None:
    import logging

    from metactl.logs import configure

    configure(json=False, level=logging.WARNING)
    ap = argparse.ArgumentParser()
    ap.add_argument("--fence-partitions", type=int, default=1_000_000)
    ap.add_argument("--create-partitions", type=int, default=100_000)
    ap.add_argument("--skip-fence", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="metactl-bench-") as d:
        tmp = Path(d)
        if not args.skip_fence:
            asyncio.run(bench_fence(args.fence_partitions, tmp))
        asyncio.run(bench_service(args.create_partitions, tmp))
        asyncio.run(bench_slicing(args.create_partitions, tmp))


if __name__ == "__main__":
    main()
