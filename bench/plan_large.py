"""The maintenance pre-flight on a large cluster (issue 34): how long `metactl plan
restart` and `metactl plan roll` take the controller, and how large their answers are.

An image of `--partitions` partitions (default 100,000) on `--brokers` brokers (default
6), replication factor 3, MinISR 2, every ISR full, is replayed from records; then the
planner (`planning`, what the controller runs in a worker thread for PlanRestart and
PlanRoll) plans a restart of broker 1 (both cases) and the roll of every broker, each
`--repeat` times (the best is printed), with the default list limit (1,000) and the
largest (100,000), and the encoded answer's size against the 8 MiB frame. The roll's
time is split per step by its parts' share (one controlled shutdown, registration,
unfence and ISR expansion per broker). As `serve` does once its image is loaded, the heap
is frozen before measuring.

With `--service`, the same roll is also asked of a real controller process (`python -m
controller`, `--insecure`, on a SQLite log, the cluster created through CreateTopics),
while every broker heartbeats every 200 ms and an operator describes a small topic every
100 ms, each timed from when it was due: the plan's time over the wire, and the
heartbeats' and describes' p50 / p99 / max before (idle, 3 s) and while the plan is made
(in the controller's worker thread). The process is stopped at the end.

Run: python bench/plan_large.py [--partitions 100000] [--brokers 6] [--repeat 3] [--service]
Prints figures and ratios; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.core.config import ControllerConfig
from controller.core.recovery.registry import load_policies
from controller.core.step import Rules
from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from metadata_log.records import (
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
)
from planning.restart import plan_restart
from planning.roll import plan_roll
from planning.whatif import WhatIf
from protocol.client import RpcClient
from protocol.codec import DEFAULT_MAX_FRAME_BYTES, encode_frame
from protocol.messages.admin import (
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeClusterRequest,
)
from protocol.messages.broker_controller import (
    BrokerHeartbeatRequest,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.messages.plan import (
    MAX_PLAN_LIST_ITEMS,
    PLAN_LIST_ITEMS,
    PlanRestartResponse,
    PlanRollRequest,
    PlanRollResponse,
)
from protocol.messages.unions import Message

REPO = Path(__file__).resolve().parents[1]
HEARTBEAT_PERIOD_S = 0.2
DESCRIBE_PERIOD_S = 0.1

PER_TOPIC = 10_000
T = TypeVar("T")


def image_of(partitions: int, brokers: int) -> ClusterImage:
    """Brokers 1..`brokers` active; topics of up to 10,000 partitions, partition i on
    brokers i, i+1, i+2 (mod `brokers`, striped), ISR full, MinISR 2."""
    records: list[MetadataRecord] = []
    for i, b in enumerate(range(1, brokers + 1)):
        records.append(
            RegisterBrokerRecord(broker_id=b, incarnation_id=f"b{b}", broker_epoch=2 * i)
        )
        records.append(UnfenceBrokerRecord(broker_id=b, broker_epoch=2 * i))
    for start in range(0, partitions, PER_TOPIC):
        n = min(PER_TOPIC, partitions - start)
        name = f"t{start // PER_TOPIC:04d}"
        records.append(TopicRecord(name=name, topic_id=name, partitions=n, min_isr=2))
        for i in range(n):
            replicas = [(i + j) % brokers + 1 for j in range(3)]
            records.append(
                PartitionRecord(
                    topic=name, partition=i, replicas=replicas, isr=replicas,
                    leader=replicas[0], min_isr=2,
                )
            )  # fmt: skip
    return replay(ClusterImage(), records)


def best(repeat: int, run: Callable[[], T]) -> tuple[float, T]:
    """The best time of `repeat` runs, and the last run's answer."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - t)
    return min(times), out


def answer_bytes(answer: PlanRestartResponse | PlanRollResponse) -> int:
    return len(encode_frame(1, answer))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=100_000)
    ap.add_argument("--brokers", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--service", action="store_true", help="also through a controller process")
    args = ap.parse_args()
    t = time.perf_counter()
    image = image_of(args.partitions, args.brokers)
    built = time.perf_counter() - t
    rules = Rules(ControllerConfig(), load_policies())
    gc.collect()
    gc.freeze()
    hosted = len(image.replicas_by_broker[1])
    print(
        f"image: {args.partitions:,} partitions on {args.brokers} brokers, RF 3, MinISR 2 "
        f"(built in {built:.2f} s); broker 1 hosts {hosted:,}"
    )
    for limit in (PLAN_LIST_ITEMS, MAX_PLAN_LIST_ITEMS):
        s, restart = best(
            args.repeat, partial(plan_restart, image, 1, rules=rules, now_ms=0, limit=limit)
        )
        print(
            f"plan restart --broker 1 (limit {limit:,}): {s:.2f} s "
            f"({s / hosted * 1e6:.1f} µs per hosted partition, both cases), answer "
            f"{answer_bytes(restart):,} bytes"
        )
    for limit in (PLAN_LIST_ITEMS, MAX_PLAN_LIST_ITEMS):
        s, roll = best(args.repeat, partial(plan_roll, image, rules=rules, now_ms=0, limit=limit))
        size = answer_bytes(roll)
        print(
            f"plan roll (limit {limit:,}): {s:.2f} s for {len(roll.steps)} steps "
            f"({s / args.partitions / 3 * 1e6:.1f} µs per replica), answer {size:,} bytes "
            f"({size / DEFAULT_MAX_FRAME_BYTES:.0%} of the 8 MiB frame)"
        )
    # One step's parts, on a fresh copy (what the roll does per broker).
    w = WhatIf(image, rules, 0)
    parts = []
    for name, run in (
        ("controlled shutdown", lambda: w.shut_down(1)),
        ("clean registration", lambda: w.register_again(1, clean=True)),
        ("unfence", lambda: w.unfence(1)),
        ("ISR expansion (AlterPartitions)", lambda: w.rejoin(1)),
    ):
        t = time.perf_counter()
        run()
        parts.append((name, time.perf_counter() - t))
    total = sum(s for _, s in parts)
    print(
        "one roll step (broker 1): "
        + ", ".join(f"{name} {s:.3f} s ({s / total:.0%})" for name, s in parts)
    )
    if args.service:
        asyncio.run(bench_service(args.partitions, args.brokers))


def start_controller(data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    """A `python -m controller` process (--insecure, long sessions, quota and request cap
    lifted) and the address its READY line names."""
    cmd = [sys.executable, "-m", "controller", "--data-dir", str(data_dir),
           "--listen", "127.0.0.1:0", "--insecure", "--session-timeout-ms", "600000",
           "--log-level", "WARNING", "--max-partitions-per-request", "100000000",
           "--controller-mutation-rate", "0"]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO
    )
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("the controller exited early")
        if line.startswith("READY"):
            fields = dict(f.split("=", 1) for f in line.split()[2:])
            return proc, fields["listen"]


async def paced(
    send: Callable[[], Awaitable[object]],
    period: float,
    offset: float,
    stop: asyncio.Event,
    out: list[float],
) -> None:
    """`send()` every `period` s, each timed from when it was due (a stall counts for every
    request it held back)."""
    due = time.perf_counter() + offset
    while not stop.is_set():
        wait = due - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)  # the schedule: pacing, not synchronisation
        await send()
        out.append((time.perf_counter() - due) * 1000)
        due += period


async def probes(
    address: str, beats: list[Message], work: asyncio.Task[tuple[Message, float]] | None
) -> tuple[list[float], list[float]]:
    """Heartbeat and describe latencies until `work` is done (or for 3 s)."""
    clients = [RpcClient(address) for _ in range(len(beats) + 1)]
    stop = asyncio.Event()
    hbs: list[float] = []
    describes: list[float] = []
    tasks = []
    for i, (client, beat) in enumerate(zip(clients, beats, strict=False)):
        send = partial(client.request, beat, 120.0)
        offset = HEARTBEAT_PERIOD_S * i / len(beats)
        tasks.append(asyncio.create_task(paced(send, HEARTBEAT_PERIOD_S, offset, stop, hbs)))
    describe = partial(clients[-1].request, DescribeClusterRequest(topic="small"), 120.0)
    tasks.append(asyncio.create_task(paced(describe, DESCRIBE_PERIOD_S, 0, stop, describes)))
    try:
        if work is None:
            await asyncio.sleep(3)  # the measuring window itself
        else:
            await work
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        for client in clients:
            await client.close()
    return hbs, describes


def pct(samples: list[float]) -> str:
    xs = sorted(samples)
    if not xs:
        return "none"

    def p(q: int) -> float:
        return xs[min(len(xs) - 1, len(xs) * q // 100)]

    return f"p50 {p(50):.1f} / p99 {p(99):.1f} / max {xs[-1]:.1f} ms ({len(xs)} requests)"


async def bench_service(partitions: int, brokers: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        proc, address = start_controller(Path(tmp))
        try:
            conn = RpcClient(address)
            beats: list[Message] = []
            for b in range(1, brokers + 1):
                r = await conn.request(RegisterBroker(broker_id=b, incarnation_id=f"b{b}"))
                assert isinstance(r, RegisterBrokerResponse)
                beat = BrokerHeartbeatRequest(
                    broker_id=b, broker_epoch=r.broker_epoch, metadata_offset=r.broker_epoch + 1
                )
                await conn.request(beat)
                beats.append(beat)
            t = time.perf_counter()
            topics = [
                CreateTopic(name=f"t{i:04d}", partitions=min(PER_TOPIC, partitions - start),
                            replication_factor=3, min_isr=2)
                for i, start in enumerate(range(0, partitions, PER_TOPIC))
            ]  # fmt: skip
            topics.append(CreateTopic(name="small", partitions=1, replication_factor=3))
            created = await conn.request(CreateTopicsRequest(topics=topics), 600.0)
            assert isinstance(created, CreateTopicsResponse)
            print(f"service: {partitions:,} partitions created in {time.perf_counter() - t:.1f} s")
            hbs, ds = await probes(address, beats, None)
            print(f"service, idle: heartbeats {pct(hbs)}; describes {pct(ds)}")
            t = time.perf_counter()

            async def roll() -> tuple[Message, float]:
                answer = await conn.request(PlanRollRequest(limit=0), 600.0)
                return answer, time.perf_counter() - t

            work = asyncio.create_task(roll())
            hbs, ds = await probes(address, beats, work)
            answer, took = work.result()
            assert isinstance(answer, PlanRollResponse)
            print(
                f"service, plan roll over the wire: {took:.2f} s ({len(answer.steps)} steps); "
                f"meanwhile heartbeats {pct(hbs)}; describes {pct(ds)}"
            )
            await conn.close()
        finally:
            proc.terminate()
            proc.wait(timeout=60)


if __name__ == "__main__":
    main()
