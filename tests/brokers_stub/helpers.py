"""Builders shared by the stub broker's tests: cluster images, configs, polling, and a
`Broker` running in the test's event loop against the fake controller."""

from __future__ import annotations

import asyncio
import io
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from brokers_stub.broker import Broker
from brokers_stub.config import BrokerConfig
from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from metadata_log.records import (
    ChangeReason,
    LeaderRecoveryState,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
)
from tests.brokers_stub.fake_controller import FakeController

TOPIC = "orders"


def cluster(
    brokers: dict[int, int],
    *,
    replicas: Sequence[int],
    leader: int,
    isr: Sequence[int],
    leader_epoch: int = 0,
    partition_epoch: int = 0,
    min_isr: int = 1,
    recovering: bool = False,
    fenced: Sequence[int] = (),
) -> ClusterImage:
    """An image with `brokers` ({id: epoch}, unfenced unless in `fenced`) and one
    partition orders-0."""
    records: list[MetadataRecord] = [
        RegisterBrokerRecord(
            broker_id=b,
            incarnation_id=f"inc-{b}",
            broker_epoch=e,
            endpoint=f"127.0.0.1:{10000 + b}",
            fenced=b in fenced,
        )
        for b, e in sorted(brokers.items())
    ]
    records.append(TopicRecord(name=TOPIC, topic_id="t-1", partitions=1, min_isr=min_isr))
    records.append(
        PartitionRecord(
            topic=TOPIC,
            partition=0,
            replicas=list(replicas),
            isr=sorted(isr),
            leader=leader,
            leader_epoch=leader_epoch,
            partition_epoch=partition_epoch,
            min_isr=min_isr,
            recovery_state=(
                LeaderRecoveryState.RECOVERING if recovering else LeaderRecoveryState.RECOVERED
            ),
        )
    )
    return replay(ClusterImage(), records)


def change(
    image: ClusterImage,
    *,
    leader: int | None = None,
    isr: Sequence[int] | None = None,
    recovered: bool = False,
) -> ClusterImage:
    """The image after one PartitionChangeRecord on orders-0 (epochs bumped as the
    controller does)."""
    p = image.partitions[(TOPIC, 0)]
    leader_changed = leader is not None and leader != p.leader
    return replay(
        image,
        [
            PartitionChangeRecord(
                topic=TOPIC,
                partition=0,
                reason=ChangeReason.ALTER_PARTITION,
                partition_epoch=p.partition_epoch + 1,
                leader_epoch=p.leader_epoch + 1 if leader_changed else p.leader_epoch,
                leader=leader if leader_changed else None,
                isr=sorted(isr) if isr is not None else None,
                recovery_state=LeaderRecoveryState.RECOVERED if recovered else None,
            )
        ],
    )


def config(data_dir: Path, broker_id: int = 1, **kw: object) -> BrokerConfig:
    return BrokerConfig(
        broker_id=broker_id,
        controller="127.0.0.1:1",
        data_dir=data_dir,
        **kw,  # type: ignore[arg-type]
    )


async def eventually(
    condition: Callable[[], bool], *, timeout_s: float = 10.0, what: str = "condition"
) -> None:
    """Poll an observable condition until it holds; fail the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        await asyncio.sleep(0.01)  # polling interval of an observable condition
    raise AssertionError(f"timed out waiting for {what}")


READY = re.compile(r"^READY broker=(\d+) epoch=(\d+) endpoint=(127\.0\.0\.1:\d+)$")


class Running:
    def __init__(self, config: BrokerConfig) -> None:
        self.stdout = io.StringIO()
        self.broker = Broker(config, stdout=self.stdout)
        self.task = asyncio.create_task(self.broker.run(install_signals=False))

    def ready(self) -> re.Match[str] | None:
        return READY.match(self.stdout.getvalue().strip())

    async def await_ready(self) -> re.Match[str]:
        await eventually(lambda: self.ready() is not None or self.task.done(), what="READY")
        m = self.ready()
        assert m is not None, f"no READY line; stdout={self.stdout.getvalue()!r}"
        return m

    async def stop(self) -> int:
        self.broker.request_shutdown()
        async with asyncio.timeout(30):
            return await self.task


def broker_config(controller: FakeController, data_dir: Path, **kw: object) -> BrokerConfig:
    args: dict[str, object] = {
        "broker_id": 1,
        "controller": controller.address,
        "data_dir": data_dir,
        "heartbeat_interval_ms": 30,
        "metadata_max_wait_ms": 50,
        "fetch_interval_ms": 20,
        "replica_tick_ms": 20,
        "flush_interval_ms": 50,
        "session_timeout_ms": 2000,
    }
    args.update(kw)
    return BrokerConfig(**args)  # type: ignore[arg-type]
