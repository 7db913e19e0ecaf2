"""Handshake floods (issue 22, item 10) against a real controller and a real broker with
mutual TLS, at the size the issue measured. Prints figures and ratios; asserts nothing.

Each scenario starts a fresh target process (`metactl controller serve`, or `metactl
broker run` registered with a controller) and:

1. runs a flood process holding `--flood` (3,000) TCP connections from 127.0.0.1 and
   `--per-other` (250) from each of `--others` (5) more addresses, 127.0.0.2-.6. Each
   connection is opened and never speaks (`--mode silent`: the issue's "stalled
   connects"), or sends one TLS ClientHello and then nothing (`--mode hello`, which makes
   the server start a handshake). A connection the server closes is opened again at once,
   so the flood keeps its size for as long as it runs, as an attacker would: against a
   server that closes the pending connections it drops, this is a connection-rate flood;
   one that parks them (holds them open until their deadline, protocol/server.py) holds
   it (`--reconnect-after S` paces the reopening);
2. meanwhile two healthy admin clients, one on 127.0.0.1 (the flood's own address) and
   one on 127.0.0.7, each send a request over a fresh TLS connection every 0.1 s for
   `--seconds` (a DescribeCluster to the controller, a ReadLog to the broker), each
   bounded by 5 s, and count how many are answered;
3. measures the target's RSS (/proc/PID/status) before the flood, its peak during it and
   `--settle` seconds after it ends; and the lines and bytes it logged during the flood.

Then `--oversized` (5,000) connections to a fresh controller each send a frame header
over the size limit (as a fuzzer's inputs do), and the lines and bytes the controller
logged for them are counted (issue 22: 200k fuzzed inputs wrote 13.9 MB of log).

Goals (issue 22, "Done means"): a healthy admin client succeeds >= 99% of the time on
the controller and on a broker; RSS returns to within 20% of its start after the flood.

Run: python bench/connection_flood.py [--flood 3000] [--others 5] [--per-other 250]
     [--seconds 20] [--settle 10] [--mode silent|hello|both] [--targets controller,broker]
     [--reconnect-after S] [--oversized 5000]
The code under test is the checkout this file is in.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import ssl
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

from localcluster.certs import default_names, init_certs
from protocol.codec import decode_frame, encode_frame
from protocol.messages.admin import DescribeClusterRequest
from protocol.messages.data import ReadLogRequest
from protocol.messages.unions import Message
from protocol.tls import ADMIN, TlsIdentity
from protocol.transport import read_frame

REPO = Path(__file__).resolve().parents[1]
SAME = "127.0.0.1"  # the flood's main address, and the first healthy client's
OTHER = "127.0.0.7"  # an address the flood does not use
REQUEST_EVERY_S = 0.1
REQUEST_TIMEOUT_S = 5.0


# --- the flood process -------------------------------------------------------------------


def client_hello() -> bytes:
    """The first flight of a TLS client: what a `--mode hello` connection sends."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_side=False)
    with contextlib.suppress(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


async def flood(address: str, sources: list[tuple[str, int]], mode: str, pause: float) -> None:
    """Hold `n` connections from each source address until SIGTERM, reopening each one
    the server closes (after `pause` seconds); print a status line a second."""
    loop = asyncio.get_running_loop()
    host, port = address.rsplit(":", 1)
    hello = client_hello() if mode == "hello" else b""
    counts = {"live": 0, "opened": 0, "closed": 0, "failed": 0}
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    gate = asyncio.Semaphore(256)  # connects in flight at once

    async def hold(src: str) -> None:
        while not stop.is_set():
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.bind((src, 0))
                async with gate:
                    await loop.sock_connect(s, (host, int(port)))
                if hello:
                    await loop.sock_sendall(s, hello)
            except OSError:
                counts["failed"] += 1
                s.close()
                await asyncio.sleep(0.05)
                continue
            counts["opened"] += 1
            counts["live"] += 1
            with contextlib.suppress(OSError):
                while await loop.sock_recv(s, 65536):
                    pass  # a ServerHello (hello mode): read and ignore it
            counts["live"] -= 1
            counts["closed"] += 1
            s.close()
            if pause:
                await asyncio.sleep(pause)

    tasks = [asyncio.create_task(hold(src)) for src, n in sources for _ in range(n)]
    while not stop.is_set():
        print("FLOOD " + " ".join(f"{k}={v}" for k, v in counts.items()), flush=True)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await stop.wait()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    print("FLOOD " + " ".join(f"{k}={v}" for k, v in counts.items()), flush=True)


# --- the bench ----------------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def log_size(log: Path) -> tuple[int, int]:
    """Lines and bytes a process has logged so far."""
    data = log.read_bytes()
    return data.count(b"\n"), len(data)


def metactl(*args: str) -> list[str]:
    return [sys.executable, "-m", "ops.cli", *args]


def start(cmd: list[str], log: Path, prefix: str) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with log.open("w") as err:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=REPO, env=env
        )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(prefix):
        raise RuntimeError(f"{cmd[3:5]} did not start: {line!r}; see {log}")
    return proc, line


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass
class Target:
    name: str
    proc: subprocess.Popen[str]
    address: str
    log: Path
    request: Message


@dataclass
class Probe:
    source: str
    ok: int = 0
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)

    def line(self) -> str:
        n = self.ok + self.failed
        return (
            f"admin client on {self.source}: {self.ok}/{n} answered "
            f"({100 * self.ok / max(1, n):.1f}%), p50 {1000 * pct(self.latencies, 50):.0f} ms, "
            f"p99 {1000 * pct(self.latencies, 99):.0f} ms"
            + (f", failures {self.errors}" if self.errors else "")
        )


async def ask(address: str, ctx: ssl.SSLContext, source: str, body: Message) -> Message:
    """One request over a fresh mutual-TLS connection from `source`."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(
        host, int(port), ssl=ctx, server_hostname=host, local_addr=(source, 0)
    )
    try:
        writer.write(encode_frame(1, body))
        await writer.drain()
        return decode_frame(await read_frame(reader)).body
    finally:
        writer.close()


async def probe(p: Probe, t: Target, ctx: ssl.SSLContext, until: float) -> None:
    """Requests every REQUEST_EVERY_S until `until`; any answer counts, a coded error too
    (a broker's ReadLog of a topic it does not lead)."""
    while time.monotonic() < until:
        began = time.monotonic()
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                await ask(t.address, ctx, p.source, t.request)
            p.ok += 1
            p.latencies.append(time.monotonic() - began)
        except (OSError, TimeoutError, EOFError, asyncio.IncompleteReadError, ValueError) as exc:
            p.failed += 1
            name = type(exc).__name__
            p.errors[name] = p.errors.get(name, 0) + 1
        await asyncio.sleep(max(0.0, REQUEST_EVERY_S - (time.monotonic() - began)))


def pct(xs: list[float], q: int) -> float:
    if len(xs) < 2:
        return xs[0] if xs else float("nan")
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1]


async def scenario(t: Target, certs: Path, args: argparse.Namespace, mode: str) -> None:
    pid = t.proc.pid
    ctx = TlsIdentity.from_dir(certs, ADMIN).client_context()
    for _ in range(5):  # warm up, then the starting RSS
        await ask(t.address, ctx, SAME, t.request)
    await asyncio.sleep(1.0)
    rss0 = rss_mb(pid)
    lines0, bytes0 = await asyncio.to_thread(log_size, t.log)
    sources = [(SAME, args.flood)]
    sources += [(f"127.0.0.{2 + i}", args.per_other) for i in range(args.others)]
    spec = ",".join(f"{a}={n}" for a, n in sources)
    worker = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--worker", t.address, spec, mode, str(args.reconnect_after),
        stdout=subprocess.PIPE, cwd=REPO,
    )  # fmt: skip
    assert worker.stdout is not None
    total = sum(n for _, n in sources)
    status = ""
    with contextlib.suppress(TimeoutError):  # until the flood holds its size, or 10 s
        async with asyncio.timeout(10):
            while True:
                status = (await worker.stdout.readline()).decode()
                if int(status.split("live=")[1].split()[0]) >= total:
                    break

    async def drain() -> None:
        nonlocal status
        assert worker.stdout is not None
        while line := (await worker.stdout.readline()).decode():
            status = line

    reading = asyncio.create_task(drain())
    peak = rss_mb(pid)
    probes = [Probe(SAME), Probe(OTHER)]
    until = time.monotonic() + args.seconds

    async def sample() -> None:
        nonlocal peak
        while time.monotonic() < until:
            peak = max(peak, rss_mb(pid))
            await asyncio.sleep(0.25)

    await asyncio.gather(sample(), *(probe(p, t, ctx, until) for p in probes))
    worker.send_signal(signal.SIGTERM)
    await worker.wait()
    await reading
    lines1, bytes1 = await asyncio.to_thread(log_size, t.log)
    await asyncio.sleep(args.settle)
    rss1 = rss_mb(pid)
    ok = sum(p.ok for p in probes)
    n = sum(p.ok + p.failed for p in probes)
    print(f"\n{t.name}, {mode} flood of {total:,} connections ({spec}), {args.seconds:.0f} s")
    print(f"  the flood at its end: {status.strip()}")
    for p in probes:
        print(f"  {p.line()}")
    print(f"  healthy requests answered: {ok}/{n} = {100 * ok / max(1, n):.1f}% (goal >= 99%)")
    print(
        f"  RSS: {rss0:.0f} MB before, {peak:.0f} MB peak ({peak / rss0:.2f}x), {rss1:.0f} MB "
        f"{args.settle:.0f} s after the flood ({rss1 / rss0:.2f}x; goal <= 1.20x)"
    )
    print(f"  logged during the flood: {lines1 - lines0} lines, {(bytes1 - bytes0) / 1024:.1f} KiB")


async def oversized(t: Target, certs: Path, n: int) -> None:
    """`n` TLS connections, each sending one oversized frame header; the log they cost."""
    ctx = TlsIdentity.from_dir(certs, ADMIN).client_context()
    host, port = t.address.rsplit(":", 1)
    lines0, bytes0 = await asyncio.to_thread(log_size, t.log)
    todo = iter(range(n))
    answered = 0

    async def worker() -> None:
        nonlocal answered
        for _ in todo:
            reader, writer = await asyncio.open_connection(
                host, int(port), ssl=ctx, server_hostname=host
            )
            writer.write((1 << 30).to_bytes(4, "big"))
            with contextlib.suppress(OSError, EOFError, asyncio.IncompleteReadError):
                await read_frame(reader)  # MESSAGE_TOO_LARGE, then the server closes
                answered += 1
            writer.close()

    began = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(16)))
    took = time.monotonic() - began
    await asyncio.sleep(2.5)  # the held-back count is told a period later
    lines1, bytes1 = await asyncio.to_thread(log_size, t.log)
    lines, kib = lines1 - lines0, (bytes1 - bytes0) / 1024
    print(f"\ncontroller, {n:,} oversized frames, each on its own TLS connection, {took:.0f} s")
    print(f"  answered MESSAGE_TOO_LARGE: {answered}/{n}")
    print(
        f"  logged: {lines} lines, {kib:.1f} KiB ({1000 * lines / n:.1f} lines and "
        f"{1000 * kib / n:.1f} KiB per 1,000 frames)"
    )


def start_controller(root: Path, certs: Path, name: str) -> Target:
    log = root / f"{name}.log"
    cmd = metactl(
        "controller", "serve", "--data-dir", str(root / name), "--listen", "127.0.0.1:0",
        "--tls-dir", str(certs),
    )  # fmt: skip
    proc, line = start(cmd, log, "READY controller")
    return Target("controller", proc, line.split("listen=")[1].split()[0], log,
                  DescribeClusterRequest())  # fmt: skip


def start_broker(root: Path, certs: Path, controller: str, name: str) -> Target:
    log = root / f"{name}.log"
    cmd = metactl(
        "broker", "run", "--id", "1", "--bootstrap-controller", controller,
        "--data-dir", str(root / name), "--listen", "127.0.0.1:0", "--tls-dir", str(certs),
    )  # fmt: skip
    proc, line = start(cmd, log, "READY broker=1")
    return Target("broker 1", proc, line.split("endpoint=")[1].split()[0], log,
                  ReadLogRequest(topic="none", partition=0))  # fmt: skip


async def main(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="flood-bench-"))
    certs = root / "certs"
    init_certs(certs, default_names([1]))
    modes = ["silent", "hello"] if args.mode == "both" else [args.mode]
    print(f"code under test: {REPO}")
    for i, mode in enumerate(modes):
        if "controller" in args.targets.split(","):
            ctl = start_controller(root, certs, f"controller-{i}")
            try:
                await scenario(ctl, certs, args, mode)
            finally:
                stop(ctl.proc)
        if "broker" in args.targets.split(","):
            ctl = start_controller(root, certs, f"controller-for-broker-{i}")
            broker = None
            try:
                broker = start_broker(root, certs, ctl.address, f"broker-{i}")
                await scenario(broker, certs, args, mode)
            finally:
                if broker is not None:
                    stop(broker.proc)
                stop(ctl.proc)
    if args.oversized:
        ctl = start_controller(root, certs, "controller-oversized")
        try:
            await oversized(ctl, certs, args.oversized)
        finally:
            stop(ctl.proc)
    print(f"\nlogs in {root}")


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--worker":
        srcs = [(a, int(n)) for a, n in (x.split("=") for x in sys.argv[3].split(","))]
        asyncio.run(flood(sys.argv[2], srcs, sys.argv[4], float(sys.argv[5])))
        sys.exit(0)
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--flood", type=int, default=3000, help="connections from 127.0.0.1")
    ap.add_argument("--others", type=int, default=5, help="more flooding addresses")
    ap.add_argument("--per-other", type=int, default=250, help="connections from each")
    ap.add_argument("--seconds", type=float, default=20.0, help="how long the flood runs")
    ap.add_argument("--settle", type=float, default=10.0, help="RSS measured this long after")
    ap.add_argument("--mode", choices=["silent", "hello", "both"], default="both")
    ap.add_argument("--targets", default="controller,broker")
    ap.add_argument("--oversized", type=int, default=5000, help="oversized frames (0: none)")
    ap.add_argument(
        "--reconnect-after",
        type=float,
        default=0.0,
        help="a flood connection the server closed is reopened this many seconds later",
    )
    asyncio.run(main(ap.parse_args()))
