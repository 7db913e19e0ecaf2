"""Real processes for the HA tests: a local etcd cluster, several `python -m controller`
processes on one etcd log, brokers given every controller, and a client that keeps
creating topics and records what was acknowledged.

Everything runs on loopback in plaintext (`--insecure`: mutual TLS is tested elsewhere,
and these tests are about who may write the log). Waiting is on observable state: the
leadership key in etcd, a describe answer, an acknowledged write.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localcluster.etcd import LocalEtcd
from metactl.errors import MetactlError
from metadata_log.etcd.client import Etcd
from metadata_log.etcd.lease import LeaderInfo, current_leader
from metadata_log.etcd.store import EtcdLogStore
from metadata_log.etcd.target import EtcdTarget, prefix_end
from protocol.client import Endpoints, FailoverPolicy, RetryPolicy, RpcClient
from protocol.messages.admin import (
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
)
from protocol.messages.unions import Message
from tests.e2e.cluster import HEARTBEAT_MS, SESSION_MS, TIMEOUT_S, Process, free_port

LEASE_TTL_S = 2
CLUSTER_ID = "ha-e2e"


class HaCluster:
    def __init__(
        self,
        root: Path,
        *,
        etcd_members: int = 3,
        controllers: int = 3,
        controller_args: tuple[str, ...] = (),
    ) -> None:
        self.root = root
        self.controller_args = controller_args  # more flags for every controller
        self.etcd = LocalEtcd(root / "etcd", etcd_members)
        self.addresses = [f"127.0.0.1:{free_port()}" for _ in range(controllers)]
        self.controllers: dict[str, Process] = {}
        self.brokers: dict[int, Process] = {}

    @property
    def url(self) -> str:
        return self.etcd.url("metactl/e2e")

    @property
    def bootstrap(self) -> str:
        return ",".join(self.addresses)

    def start(self) -> HaCluster:
        self.etcd.start()
        for address in self.addresses:
            self.start_controller(address)
        return self

    def start_controller(self, address: str, *, ready: bool = True) -> Process:
        """Start the controller of `address` and (with `ready`) wait for its READY."""
        i = self.addresses.index(address) + 1
        p = Process(
            f"controller-{i}",
            [sys.executable, "-m", "controller", "--data-dir", str(self.root / f"c{i}"),
             "--listen", address, "--metadata-log", self.url, "--cluster-id", CLUSTER_ID,
             "--lease-ttl-s", str(LEASE_TTL_S), "--node-id", f"c{i}",
             "--heartbeat-interval-ms", str(HEARTBEAT_MS), "--session-timeout-ms",
             str(SESSION_MS), "--insecure", *self.controller_args],
            self.root / "logs" / f"controller-{i}.log",
        )  # fmt: skip
        if ready:
            p.await_ready()
        self.controllers[address] = p
        return p

    def start_broker(self, broker_id: int) -> Process:
        p = Process(
            f"broker-{broker_id}",
            [sys.executable, "-m", "brokers_stub", "--id", str(broker_id),
             "--controller", self.bootstrap, "--data-dir", str(self.root / f"b{broker_id}"),
             "--heartbeat-interval-ms", str(HEARTBEAT_MS), "--session-timeout-ms",
             str(SESSION_MS), "--flush-interval-ms", "200", "--insecure"],
            self.root / "logs" / f"broker-{broker_id}.log",
        )  # fmt: skip
        p.await_ready()
        self.brokers[broker_id] = p
        return p

    def stop(self) -> None:
        for p in [*self.brokers.values(), *self.controllers.values()]:
            p.signal(signal.SIGCONT)
            p.signal(signal.SIGTERM)
        for p in [*self.brokers.values(), *self.controllers.values()]:
            with contextlib.suppress(Exception):
                p.wait(20)
            p.close()
        self.etcd.stop()

    # --- observing -------------------------------------------------------------------------

    def events(self, address: str) -> list[dict[str, Any]]:
        """The structured log lines (JSON) the controller at `address` wrote so far, over
        every run of it."""
        log = self.root / "logs" / f"controller-{self.addresses.index(address) + 1}.log"
        found = []
        for line in log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict):
                    found.append(event)
        return found

    async def leader(self) -> tuple[LeaderInfo | None, int]:
        etcd = await Etcd.connect(EtcdTarget.parse(self.url), timeout_s=2.0)
        try:
            return await current_leader(etcd)
        finally:
            await etcd.close()

    async def wait_leader(self, *, other_than: int = 0) -> tuple[LeaderInfo, int]:
        """The holder of the leadership key once it is held under a token other than
        `other_than` (a new term)."""
        async with asyncio.timeout(TIMEOUT_S):
            while True:
                with contextlib.suppress(MetactlError):
                    info, token = await self.leader()
                    if info is not None and token and token != other_than:
                        return info, token
                await asyncio.sleep(0.05)  # polling interval of an observable condition

    async def describe(self, address: str | None = None) -> DescribeClusterResponse:
        async with RpcClient(address or self.bootstrap, retry=RetryPolicy(attempts=6)) as c:
            r = await c.request(DescribeClusterRequest(v=1), timeout_s=10)
        assert isinstance(r, DescribeClusterResponse)
        return r

    async def wait_until(
        self,
        check: Callable[[DescribeClusterResponse], bool],
        what: str,
        *,
        address: str | None = None,
        timeout_s: float = TIMEOUT_S,
    ) -> DescribeClusterResponse:
        """Until a describe answer from `address` (default: any controller) passes
        `check`; after `timeout_s`, AssertionError naming `what` and the last answer."""
        deadline = time.monotonic() + timeout_s
        last: DescribeClusterResponse | None = None
        while time.monotonic() < deadline:
            with contextlib.suppress(MetactlError):  # no controller active yet, say
                last = await self.describe(address)
                if check(last):
                    return last
            await asyncio.sleep(0.1)  # polling interval of an observable condition
        raise AssertionError(f"timed out waiting for {what}; last state: {last}")

    async def log_written_once(self) -> int:
        return await log_written_once(self.url)


async def log_written_once(url: str) -> int:
    """The log under `url` verifies (offsets contiguous, every CRC) and every batch key is
    at version 1: no offset ever held two different batches. Its end offset."""
    reader = await EtcdLogStore.open(url, read_only=True)
    try:
        report = await reader.verify()
        start = reader.etcd.target.key("log/")
        kvs, _, _ = await reader.etcd.range(start, prefix_end(start))
        versions = {bytes(kv.key): int(kv.version) for kv in kvs}
        assert versions and set(versions.values()) == {1}, versions
        return report.end_offset
    finally:
        await reader.close()


class Writer:
    """Creates topics one after another through every controller (following
    NOT_CONTROLLER and failing over); records each acknowledged one and each failure."""

    def __init__(self, bootstrap: str, prefix: str = "t") -> None:
        self.endpoints = Endpoints.parse(bootstrap)
        self.prefix = prefix
        self.acked: list[str] = []
        self.failed: list[str] = []
        self.acked_at: list[float] = []
        self.acked_by: list[str] = []  # the controller that answered each acknowledged write
        self.answered_by = ""
        self._stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> Writer:
        self.task = asyncio.create_task(self._run())
        return self

    async def one(self, name: str, timeout_s: float = 5.0) -> Message:
        async with RpcClient(self.endpoints, retry=FailoverPolicy.over(self.endpoints)) as c:
            topic = CreateTopic(name=name, partitions=1, replication_factor=1)
            r = await c.request(CreateTopicsRequest(topics=[topic]), timeout_s=timeout_s)
            self.answered_by = c.address
            return r

    async def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            name = f"{self.prefix}-{i}"
            try:
                r = await self.one(name)
            except MetactlError as exc:
                self.failed.append(f"{name}: {exc.code}")
                await asyncio.sleep(0.05)  # pacing retries while there is no controller
                continue
            assert isinstance(r, CreateTopicsResponse)
            if r.results[0].error_code is None:
                self.acked.append(name)
                self.acked_at.append(time.monotonic())
                self.acked_by.append(self.answered_by)
                i += 1
            elif r.results[0].error_code == "TOPIC_ALREADY_EXISTS":
                # An earlier attempt was committed but its answer lost (the controller
                # died after the commit): it counts, it was never acknowledged.
                i += 1
            else:
                self.failed.append(f"{name}: {r.results[0].error_code}")

    async def acks_after(self, moment: float, n: int, *, not_by: str = "") -> float:
        """Until `n` writes were acknowledged after `moment` (time.monotonic), by another
        controller than `not_by`; the time of the first of them."""
        async with asyncio.timeout(TIMEOUT_S):
            while True:
                times = [
                    t
                    for t, by in zip(self.acked_at, self.acked_by, strict=True)
                    if t > moment and by != not_by
                ]
                if len(times) >= n:
                    return times[0]
                await asyncio.sleep(0.02)  # polling interval of an observable condition

    async def stop(self) -> None:
        self._stop.set()
        if self.task is not None:
            await self.task
