"""Controller service benchmarks over real TCP, with a bare asyncio echo server as baseline.

1. Heartbeats per second from 1,000 broker sessions held by this one load process (many
   connections, one request in flight on each), against a controller process.
2. Commit-to-apply latency: 20 tailing metadata clients long-poll FetchMetadata; for each
   committed change (a CreateTopics), the time from sending it until each tailer has it,
   and from its acknowledgement until each tailer has it. p50 and p99.
Both are compared with the same client pattern against a bare asyncio echo server
(a frame in, the same frame out) measured in the same run.

Run: python bench/service_load.py [--sessions 1000] [--connections 50] [--seconds 5]
Prints figures; asserts nothing.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from protocol.client import RpcClient
from protocol.codec import encode_frame
from protocol.messages import (
    BrokerHeartbeatRequest,
    CreateTopic,
    CreateTopicsRequest,
    FetchMetadataRequest,
    FetchMetadataResponse,
    RegisterBroker,
    RegisterBrokerResponse,
)
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


def start(cmd: list[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{cmd[:3]} exited early")
        if line.startswith("READY"):
            return proc, line.split("listen=")[1].split()[0]


async def connect(address: str) -> RpcClient:
    host, port = address.rsplit(":", 1)
    return await RpcClient.open(host, int(port))


class RawConnection:
    """Bare streams, for the echo server (which returns our own request frame)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def close(self) -> None:
        self.writer.close()


async def connect_raw(address: str) -> RawConnection:
    host, port = address.rsplit(":", 1)
    return RawConnection(*await asyncio.open_connection(host, int(port)))


async def heartbeat_rate(
    address: str, sessions: list[tuple[int, int]], connections: int, seconds: float, echo: bool
) -> float:
    conns: list[RpcClient | RawConnection] = [
        await (connect_raw(address) if echo else connect(address)) for _ in range(connections)
    ]
    count = 0
    stop = time.perf_counter() + seconds

    async def worker(i: int, conn: RpcClient | RawConnection) -> None:
        nonlocal count
        mine = sessions[i::connections]
        k = 0
        while time.perf_counter() < stop:
            broker_id, epoch = mine[k % len(mine)]
            req = BrokerHeartbeatRequest(
                broker_id=broker_id, broker_epoch=epoch, metadata_offset=epoch + 1
            )
            if isinstance(conn, RawConnection):  # the echo server returns our own frame
                conn.writer.write(encode_frame(k, req))
                await conn.writer.drain()
                await read_frame(conn.reader)
            else:
                await conn.request(req)
            count += 1
            k += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker(i, c) for i, c in enumerate(conns)))
    elapsed = time.perf_counter() - started
    for c in conns:
        await c.close()
    return count / elapsed


async def register(address: str, n: int) -> list[tuple[int, int]]:
    conns = [await connect(address) for _ in range(20)]
    out: list[tuple[int, int]] = []

    async def reg(i: int, conn: RpcClient) -> None:
        for b in range(i, n, len(conns)):
            r = await conn.request(RegisterBroker(broker_id=1000 + b, incarnation_id=f"i{b}"))
            assert isinstance(r, RegisterBrokerResponse)
            out.append((1000 + b, r.broker_epoch))

    await asyncio.gather(*(reg(i, c) for i, c in enumerate(conns)))
    for c in conns:
        await c.close()
    return out


async def apply_latency(
    address: str, tailers: int, changes: int
) -> tuple[list[float], list[float]]:
    conns = [await connect(address) for _ in range(tailers)]
    admin = await connect(address)
    start_offset = 0
    r = await admin.request(FetchMetadataRequest(from_offset=0, max_records=1, max_wait_ms=0))
    assert isinstance(r, FetchMetadataResponse)
    start_offset = r.end_offset
    sent: dict[str, float] = {}
    acked: dict[str, float] = {}
    seen: list[tuple[str, float]] = []
    done = asyncio.Event()

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
    done.set()
    for c in [*conns, admin]:
        await c.close()
    from_send = [(t - sent[n]) * 1000 for n, t in seen]
    from_ack = [(t - acked[n]) * 1000 for n, t in seen]
    return from_send, from_ack


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q) - 1] if len(xs) > 1 else xs[0]


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--connections", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--tailers", type=int, default=20)
    ap.add_argument("--changes", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="metactl-bench-") as d:
        ctl, address = start(
            [sys.executable, "-m", "controller", "--data-dir", d, "--listen", "127.0.0.1:0",
             "--session-timeout-ms", "600000", "--log-level", "WARNING"]
        )  # fmt: skip
        echo, echo_address = start([sys.executable, "-c", ECHO])
        try:
            sessions = asyncio.run(register(address, args.sessions))
            hb = asyncio.run(
                heartbeat_rate(address, sessions, args.connections, args.seconds, echo=False)
            )
            eb = asyncio.run(
                heartbeat_rate(echo_address, sessions, args.connections, args.seconds, echo=True)
            )
            print(
                f"heartbeats: {args.sessions} sessions over {args.connections} connections, "
                f"{args.seconds:.0f} s"
            )
            print(f"  controller  {hb:10,.0f} /s   (goal ≥ 10,000/s)")
            print(f"  echo server {eb:10,.0f} /s   ratio controller/echo {hb / eb:.2f}")
            from_send, from_ack = asyncio.run(apply_latency(address, args.tailers, args.changes))
            echo_rtt = asyncio.run(echo_latency(echo_address, 500))
            print(f"commit-to-apply on {args.tailers} tailers, {args.changes} changes:")
            rows = [
                ("send -> applied", from_send, "   (goal p99 ≤ 50 ms)"),
                ("ack  -> applied", from_ack, ""),
                ("echo round trip", echo_rtt, ""),
            ]
            for label, xs, note in rows:
                print(f"  {label}  p50 {pct(xs, 50):6.2f} ms  p99 {pct(xs, 99):6.2f} ms{note}")
            ratio = pct(from_send, 99) / pct(echo_rtt, 99)
            print(f"  ratio p99 send->applied / echo round trip: {ratio:.1f}")
        finally:
            for p in (ctl, echo):
                p.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(20)


if __name__ == "__main__":
    main()
