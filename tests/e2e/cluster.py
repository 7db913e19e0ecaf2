"""Real processes for end-to-end tests: a controller and brokers on loopback.

Processes are started with `python -m controller` / `python -m brokers_stub`, report
readiness on stdout, and are stopped with real signals. Waiting is always on observable
state (a committed record, a state in DescribeCluster) with generous timeouts.

A cluster runs with mutual TLS by default: `root/certs` holds its CA and certificates
(`localcluster.certs.init_certs`, a broker's added when it first starts), the processes get
`--tls-dir`, and the test's own requests act as `admin`. `Cluster(root, tls=False)`
passes `--insecure` instead. `cli_flags` are the flags a `metactl` client command needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from brokers_stub.replica_log import ReplicaLog, replica_path
from brokers_stub.replica_log import load as load_replica
from brokers_stub.storage import REPLICAS_DIR
from clients.controller import INSECURE, Security, call
from localcluster.certs import default_names, init_certs
from metactl.errors import NetworkError
from metactl.processes import dies_with_parent
from metadata_log.records import MetadataRecord
from protocol.client import NO_RETRY
from protocol.messages.admin import DescribeClusterRequest, DescribeClusterResponse
from protocol.messages.broker_controller import FetchMetadataRequest, FetchMetadataResponse
from protocol.messages.unions import Message
from protocol.tls import ADMIN, TlsIdentity, broker_principal

T = TypeVar("T")

HEARTBEAT_MS = 200
SESSION_MS = 1500
TIMEOUT_S = 60.0


_HANDED_OUT: set[int] = set()


def _port_range() -> tuple[int, int]:
    """The ports this test process hands out: 20000..32000, below Linux's ephemeral
    range, split between pytest-xdist's workers (PYTEST_XDIST_WORKER gw0, gw1, ...;
    PYTEST_XDIST_WORKER_COUNT of them) so that two workers never pick the same port."""
    low, high = 20000, 32000
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or count <= 1:
        return low, high
    index = int(worker[2:])
    size = (high - low) // count
    return low + index * size, low + (index + 1) * size


def free_block(n: int) -> int:
    """The first of `n` consecutive ports free on 127.0.0.1 now, below the ephemeral
    range (see `free_port`), none handed out before by this process."""
    rng = random.Random()
    low, high = _port_range()
    for _ in range(500):
        base = rng.randrange(low, high - n)
        if any(p in _HANDED_OUT for p in range(base, base + n)):
            continue
        with contextlib.ExitStack() as held:
            try:
                for port in range(base, base + n):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.update(range(base, base + n))
        return base
    raise RuntimeError(f"no {n} consecutive free ports in {low}..{high}")


def free_port() -> int:
    """A port free on 127.0.0.1 now, below Linux's ephemeral range (32768 on), and not
    handed out before by this process. A port the kernel chooses (bind to 0) lies in that
    range, where any outgoing connection may take it as its own before the process meant
    for it listens there, or a connect to it while nothing listens may connect to itself;
    restarted controllers failed with LISTEN_FAILED so."""
    rng = random.Random()
    low, high = _port_range()
    for _ in range(1000):
        port = rng.randrange(low, high)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free port in {low}..{high}")


class Process:
    def __init__(self, name: str, cmd: list[str], log: Path) -> None:
        self.name = name
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = log.open("ab")
        self.proc = subprocess.Popen(
            [*dies_with_parent(), *cmd],  # no orphan if the test run itself is killed
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            start_new_session=True,
        )
        self.ready_line = ""

    def await_ready(self, timeout_s: float = TIMEOUT_S) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{self.name} exited with {self.proc.wait()} before READY")
            if line.startswith("READY"):
                self.ready_line = line.strip()
                return self.ready_line
        raise RuntimeError(f"{self.name} not ready in {timeout_s} s")

    def field(self, key: str) -> str:
        for part in self.ready_line.split():
            if part.startswith(key + "="):
                return part.split("=", 1)[1]
        raise KeyError(key)

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def wait(self, timeout_s: float = TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # its session's group: all of it
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


class Cluster:
    def __init__(self, root: Path, strategy: str = "balanced", *, tls: bool = True) -> None:
        self.root = root
        self.strategy = strategy
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.controller: Process | None = None
        self.brokers: dict[int, Process] = {}
        self.certs = root / "certs"
        self.security = INSECURE
        if tls:
            init_certs(self.certs, default_names([]))
            self.security = Security(TlsIdentity.from_dir(self.certs, ADMIN))

    @property
    def cli_flags(self) -> list[str]:
        """What a `metactl` client command needs to reach this cluster as `admin`."""
        return ["--tls-dir", str(self.certs)] if self.security.identity else ["--insecure"]

    def _security_flags(self, broker_id: int | None = None) -> list[str]:
        if self.security.identity is None:
            return ["--insecure"]
        if broker_id is not None:
            init_certs(self.certs, [broker_principal(broker_id)])
        return ["--tls-dir", str(self.certs)]

    def start_controller(self) -> None:
        self.controller = Process(
            "controller",
            [sys.executable, "-m", "controller", "--data-dir", str(self.root / "controller"),
             "--listen", self.address, "--heartbeat-interval-ms", str(HEARTBEAT_MS),
             "--session-timeout-ms", str(SESSION_MS),
             "--unclean-recovery-strategy", self.strategy, *self._security_flags()],
            self.root / "logs" / "controller.log",
        )  # fmt: skip
        self.controller.await_ready()

    def start_broker(self, broker_id: int, *extra: str) -> Process:
        p = Process(
            f"broker-{broker_id}",
            [sys.executable, "-m", "brokers_stub", "--id", str(broker_id),
             "--controller", self.address, "--data-dir", str(self.root / f"broker-{broker_id}"),
             "--heartbeat-interval-ms", str(HEARTBEAT_MS), "--flush-interval-ms", "200",
             *self._security_flags(broker_id), *extra],
            self.root / "logs" / f"broker-{broker_id}.log",
        )  # fmt: skip
        p.await_ready()
        self.brokers[broker_id] = p
        return p

    def kill_broker(self, broker_id: int, sig: int = signal.SIGKILL) -> int:
        p = self.brokers.pop(broker_id)
        p.signal(sig)
        status = p.wait()
        p.close()
        return status

    def stop(self) -> None:
        for p in self.brokers.values():
            p.signal(signal.SIGTERM)
        for p in self.brokers.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(20)
            p.close()
        self.brokers.clear()
        if self.controller is not None:
            self.controller.signal(signal.SIGTERM)
            try:
                self.controller.wait(20)
            finally:
                self.controller.close()

    # --- observing ---

    async def request(self, body: Message) -> Message:
        return await call(self.address, body, 10, retry=NO_RETRY, security=self.security)

    async def describe(self) -> DescribeClusterResponse:
        r = await self.request(DescribeClusterRequest())
        assert isinstance(r, DescribeClusterResponse)
        return r

    async def wait_until(
        self,
        check: Callable[[DescribeClusterResponse], bool],
        what: str,
        timeout_s: float = TIMEOUT_S,
    ) -> DescribeClusterResponse:
        deadline = time.monotonic() + timeout_s
        last: DescribeClusterResponse | None = None
        while time.monotonic() < deadline:
            try:
                last = await self.describe()
                if check(last):
                    return last
            except (OSError, TimeoutError, NetworkError):
                pass  # the controller may be restarting
            await asyncio.sleep(0.1)  # polling interval of an observable condition
        raise AssertionError(f"timed out waiting for {what}; last state: {last}")

    async def records(self, from_offset: int = 0) -> list[tuple[int, MetadataRecord]]:
        out: list[tuple[int, MetadataRecord]] = []
        offset = from_offset
        while True:
            r = await self.request(FetchMetadataRequest(from_offset=offset, max_wait_ms=0))
            assert isinstance(r, FetchMetadataResponse)
            out.extend((f.offset, f.record) for f in r.records)
            if not r.records or r.records[-1].offset + 1 >= r.end_offset:
                return out
            offset = r.records[-1].offset + 1

    async def wait_for_record(
        self, match: Callable[[MetadataRecord], bool], what: str, from_offset: int = 0,
        timeout_s: float = TIMEOUT_S,
    ) -> tuple[int, MetadataRecord]:  # fmt: skip
        """Long-poll the committed log until a record matches."""
        deadline = time.monotonic() + timeout_s
        offset = from_offset
        while time.monotonic() < deadline:
            try:
                r = await self.request(FetchMetadataRequest(from_offset=offset, max_wait_ms=500))
            except (OSError, TimeoutError, NetworkError):
                await asyncio.sleep(0.1)
                continue
            assert isinstance(r, FetchMetadataResponse)
            for f in r.records:
                if match(f.record):
                    return f.offset, f.record
            if r.records:
                offset = r.records[-1].offset + 1
        raise AssertionError(f"timed out waiting for a record: {what}")

    # --- a broker's replicas on disk ---

    def replica(self, broker_id: int, topic: str, partition: int) -> ReplicaLog | None:
        """Broker `broker_id`'s replica of a partition, as its file holds it now (written
        through the page cache at every change); None if it has none."""
        replicas = self.root / f"broker-{broker_id}" / REPLICAS_DIR
        try:
            return load_replica(replica_path(replicas, topic, partition))
        except ValueError:  # no file (or none complete, as no broker leaves it)
            return None

    async def wait_for(
        self, probe: Callable[[], T | None], what: str, timeout_s: float = TIMEOUT_S
    ) -> T:
        """`probe`'s first answer that is not None (nor False), polled until `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = probe()
            if found is not None and found is not False:
                return found
            await asyncio.sleep(0.05)  # polling interval of an observable condition
        raise AssertionError(f"timed out waiting for {what}")
