"""Produce throughput: acks=all against acks=1, RF 3, MinISR 2, 3 real broker processes.

Starts a controller and three brokers (real processes on loopback), creates a topic of
`--partitions` partitions, and produces `--records` records in batches of `--batch` with
`--in-flight` batches outstanding, first with acks=all, then with acks=1, through the
same client as `metactl produce` (every acknowledged batch fsynced to an acked log
before it counts). Prints records/s for each, the ratio, each mode's batch latency (p50
/ p99 / max, from sending a batch to its answer, retries included) and the acks=all p99
on a line of its own. Asserts nothing.

Followers long-poll their leader (replica.fetch.wait.max.ms, brokers_stub/fetcher.py), so
an acks=all batch waits about one fetch round trip plus the next fetch, not a fetch
interval.

Run: python bench/produce.py [--records 200000] [--batch 500] [--in-flight 8]
     [--profile DIR]  (the brokers under cProfile: `python -m pstats DIR/broker-1.prof`)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clients.controller import call
from clients.data import leader_request
from clients.producer import produce
from localcluster.procs import await_active_brokers as _await_active
from localcluster.procs import await_ready as _await_ready
from localcluster.procs import shutdown as _shutdown
from localcluster.procs import start_process as _start
from protocol.messages.admin import (
    CreateTopic,
    CreateTopicsRequest,
    DescribeClusterRequest,
    DescribeClusterResponse,
)


async def wait_for_leaders(address: str, topic: str, partitions: int) -> None:
    while True:
        r = await call(address, DescribeClusterRequest())
        assert isinstance(r, DescribeClusterResponse)
        led = [p for p in r.partitions if p.topic == topic and p.leader >= 0 and len(p.isr) == 3]
        if len(led) == partitions:
            return
        await asyncio.sleep(0.1)  # polling observable state


@contextlib.contextmanager
def timed_batches(latencies_ms: list[float]) -> Iterator[None]:
    """Time every batch `clients.producer.produce` sends (its calls to `leader_request`,
    retries included) into `latencies_ms`."""

    async def timed(*args: Any, **kw: Any) -> Any:
        start = time.perf_counter()
        try:
            return await leader_request(*args, **kw)
        finally:
            latencies_ms.append((time.perf_counter() - start) * 1000)

    with mock.patch("clients.producer.leader_request", new=timed):  # what produce() calls
        yield


def percentile(values: list[float], q: float) -> float:
    """The `q`-th percentile (nearest rank) of `values`."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


async def bench(args: argparse.Namespace, root: Path) -> None:
    py = sys.executable
    procs: list[tuple[str, subprocess.Popen[str], IO[str]]] = []
    try:
        ctl, log = _start(
            [py, "-m", "controller", "--data-dir", str(root / "ctl"), "--listen", "127.0.0.1:0",
             "--log-level", "WARNING", "--insecure"],
            root / "ctl.log",
        )  # fmt: skip
        procs.append(("controller", ctl, log))
        address = _await_ready(ctl, "controller").split("listen=")[1].split()[0]
        for i in (1, 2, 3):
            prof = (
                ["-m", "cProfile", "-o", str(args.profile / f"broker-{i}.prof")]
                if args.profile
                else []
            )
            cmd = [py, *prof, "-m", "brokers_stub", "--id", str(i), "--controller", address,
                   "--data-dir", str(root / f"b{i}"), "--log-level", "warning",
                   "--insecure"]  # fmt: skip
            procs.append((f"broker {i}", *_start(cmd, root / f"b{i}.log")))
        for name, p, _ in procs[1:]:
            _await_ready(p, name)
        await _await_active(address, 3)
        spec = CreateTopic(
            name="bench", partitions=args.partitions, replication_factor=3, min_isr=2
        )
        await call(address, CreateTopicsRequest(topics=[spec]))
        await wait_for_leaders(address, "bench", args.partitions)
        rates: dict[str, float] = {}
        latencies: dict[str, list[float]] = {}
        for label, acks in (("acks=all", -1), ("acks=1", 1)):
            latencies[label] = []
            start_s = time.perf_counter()
            with timed_batches(latencies[label]):
                summary = await produce(
                    controller=address, topic="bench", partition=None, acks=acks,
                    count=args.records, batch=args.batch,
                    acked_log=root / f"acked-{acks}.jsonl", in_flight=args.in_flight,
                )  # fmt: skip
            took = time.perf_counter() - start_s
            rates[label] = summary.acked_records / took
            print(
                f"{label:8}: {summary.acked_records:,} records acknowledged in {took:.2f} s = "
                f"{rates[label]:,.0f} records/s ({summary.line()})"
            )
        print(f"acks=all / acks=1 throughput ratio: {rates['acks=all'] / rates['acks=1']:.2f}")
        for label, values in latencies.items():
            print(
                f"{label} produce latency ms: p50 {statistics.median(values):.1f} "
                f"p99 {percentile(values, 99):.1f} max {max(values):.1f} "
                f"({len(values)} batches)"
            )
        print(f"acks=all produce p99 latency: {percentile(latencies['acks=all'], 99):.1f} ms")
    finally:
        _shutdown(procs)  # brokers first, then the controller


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--in-flight", type=int, default=8)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="run the brokers under cProfile, writing DIR/broker-<id>.prof when they stop",
    )
    args = ap.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="metactl-produce-") as d:
        asyncio.run(bench(args, Path(d)))


if __name__ == "__main__":
    main()
