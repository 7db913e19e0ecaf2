"""Produce throughput: acks=all against acks=1, RF 3, MinISR 2, 3 real broker processes.

Starts a controller and three brokers (real processes on loopback), creates a topic of
`--partitions` partitions, and produces `--records` records in batches of `--batch` with
`--in-flight` batches outstanding, first with acks=all, then with acks=1, through the
same client as `metactl produce` (every acknowledged batch fsynced to an acked log
before it counts). Prints records/s for each and the ratio. Asserts nothing.

Run: python bench/produce.py [--records 200000] [--batch 500] [--in-flight 8]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ops.client import call
from ops.data_cmds import produce
from ops.procs import await_active_brokers as _await_active
from ops.procs import await_ready as _await_ready
from ops.procs import shutdown as _shutdown
from ops.procs import start_process as _start
from protocol.messages import (
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
            cmd = [py, "-m", "brokers_stub", "--id", str(i), "--controller", address,
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
        for label, acks in (("acks=all", -1), ("acks=1", 1)):
            start_s = time.perf_counter()
            summary = await produce(
                controller=address, topic="bench", partition=None, acks=acks,
                count=args.records, batch=args.batch, acked_log=root / f"acked-{acks}.jsonl",
                in_flight=args.in_flight,
            )  # fmt: skip
            took = time.perf_counter() - start_s
            rates[label] = summary.acked_records / took
            print(
                f"{label:8}: {summary.acked_records:,} records acknowledged in {took:.2f} s = "
                f"{rates[label]:,.0f} records/s ({summary.line()})"
            )
        print(f"acks=all / acks=1 throughput ratio: {rates['acks=all'] / rates['acks=1']:.2f}")
    finally:
        _shutdown(procs)  # brokers first, then the controller


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--in-flight", type=int, default=8)
    ap.add_argument("--partitions", type=int, default=6)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="metactl-produce-") as d:
        asyncio.run(bench(args, Path(d)))


if __name__ == "__main__":
    main()
