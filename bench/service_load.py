"""Controller service benchmarks over real TCP, with a bare asyncio echo server as baseline.

1. Heartbeats per second from `--sessions` broker sessions (default 1,000) held by this
   one load process, each on its own connection with one request in flight, as a broker
   holds its session. Measured twice in the same run, against a controller with mutual
   TLS (each session presents its own `broker-<id>` certificate, as authorization
   requires) and against one started with `--insecure`; prints both and the ratio, with
   the goals (mTLS >= 0.7x plaintext, and >= 10,000/s). The load process shares the
   machine and pays for its own TLS too, so it also prints the controller process's CPU
   time per heartbeat in each mode (from /proc): the server's own cost of mTLS.
2. Commit-to-apply latency on the mTLS controller: 20 tailing metadata clients (as
   `viewer`) long-poll FetchMetadata; for each committed change (a CreateTopics by
   `admin`), the time from sending it until each tailer has it, and from its
   acknowledgement until each tailer has it. p50 and p99.
Both are compared with the same client pattern against a bare asyncio echo server
(a frame in, the same frame out, plaintext) measured in the same run.

Run: python bench/service_load.py [--sessions 1000] [--seconds 5] [--rounds 1]
     [--profile DIR]  (the controllers under cProfile: `python -m pstats
     DIR/plaintext-0.prof`; the mTLS one's includes the commit-to-apply part)
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from localcluster.certs import default_names, init_certs
from protocol.client import RpcClient
from protocol.codec import encode_frame
from protocol.messages.admin import CreateTopic, CreateTopicsRequest
from protocol.messages.broker_controller import (
    BrokerHeartbeatRequest,
    FetchMetadataRequest,
    FetchMetadataResponse,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.tls import ADMIN, CONTROLLER, VIEWER, TlsIdentity, broker_principal
from protocol.transport import read_frame

ECHO = """
import asyncio, struct, sys
async def handle(r, w):
    try:
        while True:
            head = await r.readexactly(4)
            body = await r.readexactly(struct.unpack('>I', head)[0])
            w.write(head + body)
            await w.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        w.close()
async def main():
    s = await asyncio.start_server(handle, '127.0.0.1', 0)
    print('READY listen=127.0.0.1:%d' % s.sockets[0].getsockname()[1], flush=True)
    await s.serve_forever()
asyncio.run(main())
"""
FIRST_BROKER = 1000


def start(cmd: list[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{cmd[:3]} exited early")
        if line.startswith("READY"):
            return proc, line.split("listen=")[1].split()[0]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        print(f"pid {proc.pid} did not stop within 20 s of SIGTERM; killed", file=sys.stderr)
        proc.kill()
        proc.wait()


class Tls:
    """Client contexts by principal from one certificate directory (None: plaintext)."""

    def __init__(self, certs: Path | None) -> None:
        self.certs = certs

    def context(self, principal: str) -> ssl.SSLContext | None:
        if self.certs is None:
            return None
        return TlsIdentity.from_dir(self.certs, principal).client_context()

    def client(self, address: str, principal: str) -> RpcClient:
        return RpcClient(
            address,
            ssl=self.context(principal),
            expect_principal=CONTROLLER if self.certs is not None else None,
        )


class RawConnection:
    """Bare streams, for the echo server (which returns our own request frame)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def close(self) -> None:
        self.writer.close()


async def connect_raw(address: str) -> RawConnection:
    host, port = address.rsplit(":", 1)
    return RawConnection(*await asyncio.open_connection(host, int(port)))


Session = tuple[RpcClient | RawConnection, int, int]  # connection, broker id, epoch


async def open_sessions(address: str, n: int, tls: Tls) -> list[Session]:
    """`n` brokers, each registered over its own connection as itself (20 at a time)."""
    out: list[Session] = []
    ids = iter(range(FIRST_BROKER, FIRST_BROKER + n))

    async def opener() -> None:
        for b in ids:
            client = tls.client(address, broker_principal(b))
            r = await client.request(RegisterBroker(broker_id=b, incarnation_id=f"i{b}"))
            assert isinstance(r, RegisterBrokerResponse)
            out.append((client, b, r.broker_epoch))

    await asyncio.gather(*(opener() for _ in range(20)))
    return out


async def heartbeat_rate(
    sessions: list[Session], seconds: float, server_pid: int | None = None
) -> tuple[float, float]:
    """Heartbeats per second, and the server's CPU seconds per heartbeat (0: unknown)."""
    count = 0
    stop_at = time.perf_counter() + seconds

    async def worker(session: Session) -> None:
        nonlocal count
        conn, broker_id, epoch = session
        req = BrokerHeartbeatRequest(
            broker_id=broker_id, broker_epoch=epoch, metadata_offset=epoch + 1
        )
        k = 0
        while time.perf_counter() < stop_at:
            if isinstance(conn, RawConnection):  # the echo server returns our own frame
                conn.writer.write(encode_frame(k, req))
                await conn.writer.drain()
                await read_frame(conn.reader)
            else:
                await conn.request(req)
            count += 1
            k += 1

    cpu = cpu_seconds(server_pid) if server_pid is not None else 0.0
    started = time.perf_counter()
    await asyncio.gather(*(worker(s) for s in sessions))
    rate = count / (time.perf_counter() - started)
    cpu = cpu_seconds(server_pid) - cpu if server_pid is not None else 0.0
    return rate, cpu / max(1, count)


async def controller_heartbeats(
    address: str, pid: int, n: int, seconds: float, tls: Tls
) -> tuple[float, float]:
    sessions = await open_sessions(address, n, tls)
    try:
        return await heartbeat_rate(sessions, seconds, pid)
    finally:
        for conn, _, _ in sessions:
            await conn.close()


async def echo_heartbeats(
    address: str, n: int, seconds: float, pid: int | None = None
) -> tuple[float, float]:
    """Echoes per second, and the echo server's CPU seconds per echo (0: unknown)."""
    conns = [await connect_raw(address) for _ in range(n)]
    sessions: list[Session] = [(c, FIRST_BROKER + i, 1) for i, c in enumerate(conns)]
    try:
        return await heartbeat_rate(sessions, seconds, pid)
    finally:
        for c in conns:
            await c.close()


async def apply_latency(
    address: str, tailers: int, changes: int, tls: Tls, *, write_to: str | None = None
) -> tuple[list[float], list[float]]:
    """Tailers on `address`; the changes go to `write_to` (default: the same controller;
    bench/ha.py tails a standby while the active controller writes)."""
    conns = [tls.client(address, VIEWER) for _ in range(tailers)]
    admin = tls.client(write_to or address, ADMIN)
    r = await admin.request(FetchMetadataRequest(from_offset=0, max_records=1, max_wait_ms=0))
    assert isinstance(r, FetchMetadataResponse)
    start_offset = r.end_offset
    sent: dict[str, float] = {}
    acked: dict[str, float] = {}
    seen: list[tuple[str, float]] = []

    async def tail(conn: RpcClient) -> None:
        offset = start_offset
        got = 0
        while got < changes:
            resp = await conn.request(FetchMetadataRequest(from_offset=offset, max_wait_ms=1000))
            assert isinstance(resp, FetchMetadataResponse)
            now = time.perf_counter()
            for f in resp.records:
                name = getattr(f.record, "name", None)
                if name is not None and name.startswith("lat-"):
                    seen.append((name, now))
                    got += 1
            if resp.records:
                offset = resp.records[-1].offset + 1

    tasks = [asyncio.create_task(tail(c)) for c in conns]
    for i in range(changes):
        name = f"lat-{i}"
        sent[name] = time.perf_counter()
        await admin.request(
            CreateTopicsRequest(topics=[CreateTopic(name=name, partitions=1, replication_factor=1)])
        )
        acked[name] = time.perf_counter()
        await asyncio.sleep(0.01)  # pacing between changes, not synchronisation
    await asyncio.gather(*tasks)
    for c in [*conns, admin]:
        await c.close()
    from_send = [(t - sent[n]) * 1000 for n, t in seen]
    from_ack = [(t - acked[n]) * 1000 for n, t in seen]
    return from_send, from_ack


def pct(
    xs: list[float], q: float, method: Literal["exclusive", "inclusive"] = "exclusive"
) -> float:
    """The `q`th percentile (`statistics.quantiles`' `method`: "inclusive" stays within
    the sample, for small samples whose extremes are all there is)."""
    return statistics.quantiles(xs, n=100, method=method)[int(q) - 1] if len(xs) > 1 else xs[0]


async def echo_latency(address: str, n: int) -> list[float]:
    conn = await connect_raw(address)
    out = []
    for i in range(n):
        t = time.perf_counter()
        conn.writer.write(encode_frame(i, FetchMetadataRequest(from_offset=0)))
        await conn.writer.drain()
        await read_frame(conn.reader)
        out.append((time.perf_counter() - t) * 1000)
    await conn.close()
    return out


def controller_cmd(
    data_dir: Path, security: list[str], sessions: int, profile: Path | None = None
) -> list[str]:
    prof = ["-m", "cProfile", "-o", str(profile)] if profile is not None else []
    return [sys.executable, *prof, "-m", "controller", "--data-dir", str(data_dir),
            "--listen", "127.0.0.1:0", "--session-timeout-ms", "600000",
            "--log-level", "WARNING", "--max-connections", str(sessions + 100),
            "--max-connections-per-peer", str(sessions + 100), *security]  # fmt: skip


def _list(xs: list[float]) -> str:
    return " ".join(f"{x:,.0f}" for x in xs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=1000, help="brokers, one connection each")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=1, help="plaintext/mTLS pairs, alternating")
    ap.add_argument("--tailers", type=int, default=20)
    ap.add_argument("--changes", type=int, default=200)
    ap.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="run the controllers under cProfile, writing DIR/<mode>-<round>.prof when "
        "they stop (profiling slows them: the figures are not comparable)",
    )
    args = ap.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="metactl-bench-") as d:
        root = Path(d)
        certs = root / "certs"
        ids = range(FIRST_BROKER, FIRST_BROKER + args.sessions)
        init_certs(certs, default_names(ids))
        modes = {
            "plaintext": (["--insecure"], Tls(None)),
            "mTLS": (["--tls-dir", str(certs)], Tls(certs)),
        }
        rates: dict[str, list[float]] = {m: [] for m in modes}
        cpu: dict[str, list[float]] = {m: [] for m in modes}
        latency: tuple[list[float], list[float]] = ([], [])
        for r in range(args.rounds):
            for mode, (flags, tls) in modes.items():
                prof = args.profile / f"{mode}-{r}.prof" if args.profile else None
                cmd = controller_cmd(root / f"{mode}-{r}", flags, args.sessions, prof)
                proc, address = start(cmd)
                try:
                    run = controller_heartbeats(address, proc.pid, args.sessions, args.seconds, tls)
                    rate, cpu_each = asyncio.run(run)
                    rates[mode].append(rate)
                    cpu[mode].append(cpu_each)
                    if mode == "mTLS" and r == args.rounds - 1:
                        # The sessions stay active (long session timeout): topics can be made.
                        latency = asyncio.run(
                            apply_latency(address, args.tailers, args.changes, tls)
                        )
                finally:
                    stop(proc)
        echo, echo_address = start([sys.executable, "-c", ECHO])
        try:
            eb, echo_cpu = asyncio.run(
                echo_heartbeats(echo_address, args.sessions, args.seconds, echo.pid)
            )
            plain, mtls = (statistics.median(rates[m]) for m in ("plaintext", "mTLS"))
            print(
                f"heartbeats: {args.sessions} broker sessions, one connection each, "
                f"{args.seconds:.0f} s x {args.rounds} round(s) (median)"
            )
            print(f"  controller, plaintext  {plain:10,.0f} /s")
            print(f"  controller, mTLS       {mtls:10,.0f} /s   (goal ≥ 10,000/s)")
            print(f"  ratio mTLS/plaintext   {mtls / plain:10.2f}      (goal ≥ 0.7)")
            print(
                f"  echo server            {eb:10,.0f} /s   ratio plaintext/echo "
                f"{plain / eb:.2f} (goal ≥ 0.5), mTLS/echo {mtls / eb:.2f}"
            )
            plain_cpu, mtls_cpu = (statistics.median(cpu[m]) * 1e6 for m in modes)
            if plain_cpu > 0:
                print(
                    f"  controller CPU per heartbeat: plaintext {plain_cpu:.0f} µs, "
                    f"mTLS {mtls_cpu:.0f} µs (ratio plaintext/mTLS {plain_cpu / mtls_cpu:.2f}); "
                    f"echo server {echo_cpu * 1e6:.0f} µs per echo"
                )
            print(f"  rounds: plaintext {_list(rates['plaintext'])}, mTLS {_list(rates['mTLS'])}")
            from_send, from_ack = latency
            echo_rtt = asyncio.run(echo_latency(echo_address, 500))
            print(f"commit-to-apply (mTLS) on {args.tailers} tailers, {args.changes} changes:")
            rows = [
                ("send -> applied", from_send, "   (goal p99 ≤ 15 ms)"),
                ("ack  -> applied", from_ack, ""),
                ("echo round trip", echo_rtt, ""),
            ]
            for label, xs, note in rows:
                print(f"  {label}  p50 {pct(xs, 50):6.2f} ms  p99 {pct(xs, 99):6.2f} ms{note}")
            ratio = pct(from_send, 99) / pct(echo_rtt, 99)
            print(f"  ratio p99 send->applied / echo round trip: {ratio:.1f}")
        finally:
            stop(echo)


if __name__ == "__main__":
    main()
