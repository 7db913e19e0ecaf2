"""A real controller process SIGKILLed in the middle of a sliced fence (issue 20).

Broker 1 hosts 4,500 partitions and stops heartbeating; its session expires and the
controller (`--work-budget 5`) fences it as one transaction of about 900 slices. The
healthy brokers 2-4 keep heartbeating all along from this test. Once the log holds the
fence's begin marker and no end marker, the controller is killed. A new controller
process on the same log aborts the open transaction first (nothing of it ever took
effect), then fences broker 1 again when its session expires there, in full, while
brokers 2-4 stay unfenced: their heartbeats were answered between the slices.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import threading
from pathlib import Path

from controller.core.config import ControllerConfig
from controller.runtime.clock import VirtualClock
from controller.runtime.driver import Controller
from metadata_image.image import ClusterImage
from metadata_image.transactions import LogReplay, replay_log
from metadata_log.records import (
    AbortTransactionRecord,
    BeginTransactionRecord,
    EndTransactionRecord,
    MetadataRecord,
)
from metadata_log.sqlite_store import SqliteLogStore
from protocol.client import RpcClient
from protocol.messages.admin import CreateTopic
from protocol.messages.broker_controller import (
    BrokerHeartbeatRequest,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.messages.internal import UnfenceBroker
from tests.processes import wait_for
from tests.service.test_serve_startup import serve

PARTITIONS = 6_000  # RF 3 on 4 brokers: broker 1 hosts 4,500
SESSION_MS = 2_000


async def _write_cluster(data_dir: Path) -> dict[int, int]:
    store = await SqliteLogStore.open(data_dir)
    ctl = await Controller.open(store, config=ControllerConfig(), clock=VirtualClock())
    epochs = {}
    try:
        for b in (1, 2, 3, 4):
            r = await ctl.submit(RegisterBroker(broker_id=b, incarnation_id=f"b{b}"))
            assert isinstance(r, RegisterBrokerResponse)
            await ctl.submit(UnfenceBroker(broker_id=b, broker_epoch=r.broker_epoch))
            epochs[b] = r.broker_epoch
        await ctl.submit(CreateTopic(name="big", partitions=PARTITIONS, replication_factor=3))
    finally:
        await ctl.close()
        await store.close()
    return epochs


def _records(data_dir: Path) -> list[MetadataRecord]:
    async def read() -> list[MetadataRecord]:
        async with await SqliteLogStore.open(data_dir, read_only=True) as store:
            return [e.record async for e in store.iter_entries(0)]

    return asyncio.run(read())


def _image(records: list[MetadataRecord]) -> ClusterImage:
    return replay_log(LogReplay(), records).image


class Heartbeats:
    """Brokers 2-4's heartbeats, every 200 ms, from a thread with its own event loop, to
    whichever controller listens at `address` (errors while it is down are expected)."""

    def __init__(self, epochs: dict[int, int]) -> None:
        self.epochs = epochs
        self.address = ""
        self.answered = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self.thread.start()

    async def _run(self) -> None:
        while not self.stop.is_set():
            address = self.address
            if address:
                with contextlib.suppress(Exception):
                    async with RpcClient(address, connect_timeout=1) as c:
                        while not self.stop.is_set() and self.address == address:
                            for b in (2, 3, 4):
                                await c.request(
                                    BrokerHeartbeatRequest(
                                        broker_id=b,
                                        broker_epoch=self.epochs[b],
                                        metadata_offset=1 << 40,
                                    ),
                                    timeout_s=5,
                                )
                                self.answered += 1
                            await asyncio.sleep(0.2)  # a heartbeat interval
            await asyncio.sleep(0.05)


def _start(data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    proc = serve(
        data_dir,
        "--work-budget", "5",
        "--session-timeout-ms", str(SESSION_MS),
        "--heartbeat-interval-ms", "200",
        "--log-level", "WARNING",
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("READY controller listen="), (line, proc.stderr)
    return proc, line.split()[2].removeprefix("listen=")


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.communicate()


def _open_fence(records: list[MetadataRecord], start: int) -> bool:
    """The fence's transaction is begun after `start` and not ended."""
    tail = records[start:]
    begun = [i for i, r in enumerate(tail) if r == BeginTransactionRecord(name="FenceBroker 1")]
    return bool(begun) and not any(
        isinstance(r, EndTransactionRecord | AbortTransactionRecord) for r in tail[begun[-1] :]
    )


def test_a_controller_killed_mid_fence_aborts_it_and_the_next_one_fences_again(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    epochs = asyncio.run(_write_cluster(data_dir))
    start = len(_records(data_dir))
    beats = Heartbeats(epochs)
    proc, address = _start(data_dir)
    try:
        beats.address = address
        wait_for(
            "the fence's open transaction",
            lambda: _open_fence(_records(data_dir), start),
            every=0.02,
        )
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        killed = _records(data_dir)
        assert _open_fence(killed, start)
        # Nothing of the open transaction takes effect for a reader.
        assert not _image(killed).brokers[1].fenced
        beats.address = ""
        proc, address = _start(data_dir)
        beats.address = address

        def fenced() -> list[MetadataRecord] | None:
            records = _records(data_dir)
            image = _image(records)
            return records if image.brokers[1].fenced else None

        records = wait_for("broker 1 fenced by the second controller", fenced)
    finally:
        beats.stop.set()
        _kill(proc)
    tail = records[len(killed) :]
    # The second controller aborted the first one's transaction before anything else...
    assert isinstance(tail[0], AbortTransactionRecord) and "FenceBroker 1" in tail[0].reason
    # ...then fenced broker 1 in one transaction of its own, in full.
    assert BeginTransactionRecord(name="FenceBroker 1") in tail
    image = _image(_records(data_dir))
    assert image.brokers[1].fenced
    assert not any(1 in p.isr for p in image.partitions_of(1))
    assert all(p.leader != 1 for p in image.partitions_of(1))
    # The healthy brokers were never fenced: heartbeats were answered between slices.
    assert all(not image.brokers[b].fenced for b in (2, 3, 4))
    assert beats.answered > 0
