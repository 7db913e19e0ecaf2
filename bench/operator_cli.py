"""Operator commands as an operator runs them (real processes, a real controller):

1. `metactl events --follow --json`: how far behind the commit each event's line is. A
   client creates `--changes` topics one after another; for each, the time from the
   create's acknowledgement (it is committed by then) to the moment its line is read
   from the feed's stdout. p50 and p99. Goal: p99 <= 100 ms.
2. `metactl describe` on a cluster of `--partitions` partitions (default 100,000): the
   command's wall time (interpreter start, paging, formatting; stdout to /dev/null), and
   the time to its first line. Goal: <= 1.5 s.
3. Start-up CPU per command: `metactl --help`, `describe`, `brokers`, `configs --describe`
   and `events` (each against the controller, on a cluster of 3 brokers and one small
   topic, so their real work is small), `--startup-runs` times each as a subprocess; the
   min and median CPU seconds (user + sys of the whole process, from
   `getrusage(RUSAGE_CHILDREN)`) and wall seconds. Goal: <= 0.3 s of CPU on a quiet
   machine (issue 34). `--startup-only` runs this section alone.

Plaintext (`--insecure`): this measures the commands, not TLS. Prints figures; asserts
nothing. Run: python bench/operator_cli.py [--changes 200] [--partitions 100000]
[--startup-runs 10] [--startup-only]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from protocol.client import RpcClient
from protocol.messages.admin import CreateTopic, CreateTopicsRequest, CreateTopicsResponse
from protocol.messages.broker_controller import (
    BrokerHeartbeatRequest,
    RegisterBroker,
    RegisterBrokerResponse,
)

CLI = [sys.executable, "-m", "ops.cli"]
REPO = Path(__file__).resolve().parents[1]


def start_controller(data: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "controller", "--data-dir", str(data), "--listen",
         "127.0.0.1:0", "--insecure", "--session-timeout-ms", "600000",
         "--controller-mutation-rate", "0", "--max-partitions-per-request", "1000000",
         "--log-level", "WARNING"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    return proc, line.split("listen=")[1].split()[0]


async def brokers(address: str, n: int) -> None:
    async with RpcClient(address) as c:
        for b in range(1, n + 1):
            r = await c.request(RegisterBroker(broker_id=b, incarnation_id=f"b{b}"))
            assert isinstance(r, RegisterBrokerResponse)
            await c.request(
                BrokerHeartbeatRequest(
                    broker_id=b, broker_epoch=r.broker_epoch, metadata_offset=1 << 40
                )
            )


async def create(address: str, name: str, partitions: int) -> None:
    async with RpcClient(address) as c:
        topic = CreateTopic(name=name, partitions=partitions, replication_factor=3)
        r = await c.request(CreateTopicsRequest(topics=[topic]), timeout_s=600)
    assert isinstance(r, CreateTopicsResponse) and r.results[0].error_code is None, r


def pct(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else xs[0]


async def events_lag(address: str, changes: int) -> list[float]:
    feed = await asyncio.to_thread(
        subprocess.Popen,
        [*CLI, "events", "--follow", "--json", "--bootstrap-controller", address, "--insecure"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO,
    )  # fmt: skip
    seen: dict[str, float] = {}
    ready = threading.Event()

    def read() -> None:
        assert feed.stdout is not None
        for line in feed.stdout:
            now = time.perf_counter()
            text = json.loads(line).get("text", "")
            if text.startswith("topic lag-"):
                seen[text.split()[1]] = now
            elif "warm-up" in text:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        await create(address, "warm-up", 1)
        await asyncio.to_thread(ready.wait, 60)
        acked: dict[str, float] = {}
        for i in range(changes):
            name = f"lag-{i}"
            await create(address, name, 1)
            acked[name] = time.perf_counter()
            await asyncio.sleep(0.01)  # pacing between changes
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if len(seen) >= changes:
                break
            await asyncio.sleep(0.05)  # waiting for the last lines
        return [(seen[n] - acked[n]) * 1000 for n in acked if n in seen]
    finally:
        feed.terminate()
        feed.wait()


def describe_time(address: str) -> tuple[float, float]:
    started = time.perf_counter()
    proc = subprocess.Popen(
        [*CLI, "describe", "--bootstrap-controller", address, "--insecure"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO,
    )  # fmt: skip
    assert proc.stdout is not None
    first = 0.0
    for _ in proc.stdout:
        if not first:
            first = time.perf_counter() - started
    proc.wait()
    return time.perf_counter() - started, first


STARTUP_GOAL_S = 0.3


def startup_commands(address: str) -> dict[str, list[str]]:
    """The commands an operator runs most, as they would type them."""
    to = ["--bootstrap-controller", address, "--insecure"]
    return {
        "--help": ["--help"],
        "describe": ["describe", *to],
        "brokers": ["brokers", *to],
        "configs --describe": ["configs", *to, "--entity-type", "topics", "--describe"],
        "events": ["events", *to],
    }


def cpu_and_wall(argv: list[str]) -> tuple[float, float]:
    """One run of `metactl ARGV` to its end: (user + sys CPU seconds, wall seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([*CLI, *argv], capture_output=True, check=True, cwd=REPO)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def startup_cpu(address: str, runs: int) -> None:
    print(f"start-up CPU per command ({runs} runs each; goal <= {STARTUP_GOAL_S} s of CPU):")
    for name, argv in startup_commands(address).items():
        samples = [cpu_and_wall(argv) for _ in range(runs)]
        cpus, walls = [c for c, _ in samples], [w for _, w in samples]
        print(
            f"  metactl {name:<20} CPU min {min(cpus):.3f} s, median "
            f"{statistics.median(cpus):.3f} s; wall min {min(walls):.3f} s, median "
            f"{statistics.median(walls):.3f} s ({min(cpus) / STARTUP_GOAL_S:.1f}x the goal)"
        )


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as d:
        proc, address = start_controller(Path(d))
        try:
            await brokers(address, 3)
            await create(address, "startup", 3)
            # Sequential and on this thread: RUSAGE_CHILDREN counts the commands alone
            # (the controller, still running, is not a reaped child yet).
            startup_cpu(address, args.startup_runs)
            if args.startup_only:
                return
            lags = await events_lag(address, args.changes)
            print(
                f"events --follow: {len(lags)} of {args.changes} changes seen; lag behind the "
                f"commit p50 {statistics.median(lags):.1f} ms, p99 {pct(lags, 99):.1f} ms, "
                f"max {max(lags):.1f} ms (goal p99 <= 100 ms)"
            )
            await create(address, "huge", args.partitions)
            runs = [await asyncio.to_thread(describe_time, address) for _ in range(3)]
            best = min(runs)
            print(
                f"describe, {args.partitions:,} partitions (+{args.changes + 2} small topics): "
                f"best of 3 {best[0]:.2f} s, first line after {best[1]:.2f} s "
                f"(runs {', '.join(f'{r[0]:.2f}' for r in runs)} s; goal <= 1.5 s)"
            )
            started = time.perf_counter()
            await asyncio.to_thread(
                subprocess.run, [*CLI, "--help"], capture_output=True, check=True, cwd=REPO
            )
            print(f"  for scale: `metactl --help` takes {time.perf_counter() - started:.2f} s")
        finally:
            proc.terminate()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--changes", type=int, default=200)
    ap.add_argument("--partitions", type=int, default=100_000)
    ap.add_argument("--startup-runs", type=int, default=10, help="runs per command (default 10)")
    ap.add_argument("--startup-only", action="store_true", help="the start-up section alone")
    os.environ.setdefault("PYTHONPATH", str(REPO))
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
