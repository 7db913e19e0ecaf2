"""The largest legal request of every type against a real controller process, while two
healthy brokers heartbeat (issue 30, item 6).

One AlterPartitionReassignments of 150,000 items was applied and answered with a frame
its client could not read (which it retried), while heartbeats waited for seconds and
healthy brokers were fenced. Here every request type the controller serves is sent at
its largest legal size: the item cap of `controller.runtime.request_caps`, or as many
items as the frame limit leaves room for when the answer's bound is the tighter limit,
or a whole frame for the requests that are read in slices. Each answer must be readable
(an answer or a named error, never a frame over the limit), and the brokers' sessions
must hold throughout: every heartbeat answered unfenced, and both brokers unfenced at the
end. A request over a cap is refused by name, before anything is submitted.

No timing is asserted: the controller runs with a 3 s session timeout, so a controller
held for longer fences the brokers, and the test fails on that. Speed is measured by
`bench/large_cluster.py` (the `requests` section).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import Callable
from pathlib import Path

import msgspec

from clients.admin import ongoing
from controller.runtime.request_caps import (
    ENVELOPE,
    MAX_ALTER_PARTITION_ITEMS,
    MAX_CONFIG_ENTRIES,
    MAX_REASSIGNMENT_ITEMS,
    MAX_TOPICS_PER_REQUEST,
    result_bytes,
)
from metactl.errors import (
    FrameTooLargeError,
    InvalidRequestError,
    MetactlError,
    NetworkError,
    RequestTimedOutError,
)
from protocol.client import RpcClient
from protocol.messages.admin import (
    AlterConfigs,
    AlterPartitionReassignments,
    AlterPartitionReassignmentsResponse,
    CreatePartitions,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeConfigsRequest,
    DescribeFeaturesRequest,
    DescribeQuorumRequest,
    ElectLeader,
    ElectPreferredLeaders,
    ElectPreferredLeadersResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    Reassignment,
    UnregisterBroker,
    UpdateFeature,
)
from protocol.messages.broker_controller import (
    AlterPartition,
    AlterPartitions,
    AlterPartitionsResponse,
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    FetchMetadataRequest,
    FetchMetadataResponse,
    IsrMember,
    RegisterBroker,
    RegisterBrokerResponse,
    ReplicaRef,
)
from protocol.messages.unions import Message
from tests.service.test_serve_startup import serve

FRAME = 2 * 1024 * 1024  # the controller's --max-frame-bytes (a small one: a quick test)
SESSION_MS = 3_000
BIG = 3_000  # partitions of topic "big", RF 1 on brokers 1-2
_encode = msgspec.msgpack.encode


def largest(cap: int, per_item: int) -> int:
    """The most items a request may carry: its cap, or what the answer's bound leaves."""
    return min(cap, (FRAME - ENVELOPE) // per_item)


def frame_full(make: Callable[[int], Message]) -> Message:
    """The request of `make(n)` with the largest `n` whose frame fits FRAME."""
    low, high = 1, FRAME
    while low < high:
        mid = (low + high + 1) // 2
        if len(_encode(make(mid))) + 64 <= FRAME:
            low = mid
        else:
            high = mid - 1
    return make(low)


def start(data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    proc = serve(
        data_dir,
        "--session-timeout-ms", str(SESSION_MS),
        "--heartbeat-interval-ms", "200",
        "--max-frame-bytes", str(FRAME),
        "--controller-mutation-rate", "0",
        "--log-level", "WARNING",
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("READY controller listen="), (line, proc.stderr)
    return proc, line.split()[2].removeprefix("listen=")


class Sessions:
    """Brokers 1 and 2 heartbeating every 100 ms, each on its own connection. `live` is
    set once both are unfenced; from then on every answer must say unfenced."""

    def __init__(self, address: str, epochs: dict[int, int]) -> None:
        self.address = address
        self.epochs = epochs
        self.unfenced: set[int] = set()
        self.live = asyncio.Event()
        self.lost: list[str] = []  # what went wrong once live
        self.answered = 0
        self.stop = False
        self.tasks = [asyncio.create_task(self._beat(b)) for b in epochs]

    async def _beat(self, broker: int) -> None:
        beat = BrokerHeartbeatRequest(
            broker_id=broker, broker_epoch=self.epochs[broker], metadata_offset=1 << 40
        )
        async with RpcClient(self.address, max_frame_bytes=FRAME) as c:
            while not self.stop:
                try:
                    r = await c.request(beat, timeout_s=60)
                except MetactlError as exc:
                    if self.live.is_set():
                        self.lost.append(f"broker {broker}: {exc}")
                else:
                    assert isinstance(r, BrokerHeartbeatResponse)
                    self.answered += 1
                    if not r.is_fenced:
                        self.unfenced.add(broker)
                        if self.unfenced == set(self.epochs):
                            self.live.set()
                    elif self.live.is_set():
                        self.lost.append(f"broker {broker} fenced")
                await asyncio.sleep(0.1)  # the heartbeat interval: pacing

    async def close(self) -> None:
        self.stop = True
        await asyncio.gather(*self.tasks)


async def ask(c: RpcClient, body: Message) -> Message | MetactlError:
    """The answer, or the named error the controller answered with; a frame the client
    cannot read (or no answer) fails the test."""
    try:
        return await c.request(body, timeout_s=120)
    except (NetworkError, RequestTimedOutError) as exc:
        raise AssertionError(f"{type(body).__name__}: no readable answer: {exc}") from None
    except MetactlError as exc:
        return exc


async def scenario(address: str) -> None:
    async with RpcClient(address, max_frame_bytes=FRAME) as c:
        epochs = {}
        for b in (1, 2):
            r = await c.request(RegisterBroker(broker_id=b, incarnation_id=f"b{b}"))
            assert isinstance(r, RegisterBrokerResponse)
            epochs[b] = r.broker_epoch
        sessions = Sessions(address, epochs)
        try:
            await sessions.live.wait()
            await requests(c, epochs)
            # The brokers' sessions held: every heartbeat since both were unfenced said
            # unfenced, and the controller still has both unfenced.
            page = await c.request(DescribeClusterRequest(v=2, partition_limit=0))
            assert isinstance(page, DescribeClusterResponse)
            assert {b.broker_id: b.fenced for b in page.brokers if b.broker_id in epochs} == {
                1: False,
                2: False,
            }
        finally:
            await sessions.close()
        assert sessions.lost == []
        assert sessions.answered > 0


async def requests(c: RpcClient, epochs: dict[int, int]) -> None:
    r = await ask(
        c,
        CreateTopicsRequest(topics=[CreateTopic(name="big", partitions=BIG, replication_factor=1)]),
    )
    assert isinstance(r, CreateTopicsResponse) and r.results[0].error_code is None, r

    # AlterPartitionReassignments: as many as the cap and the answer's bound allow, half
    # real moves (which stay in progress: no broker copies), half unknown partitions.
    n = largest(MAX_REASSIGNMENT_ITEMS, result_bytes("nosuch"))
    moves = [Reassignment(topic="big", partition=i, replicas=[1, 2]) for i in range(BIG)]
    unknown = [Reassignment(topic="nosuch", partition=i, replicas=[1]) for i in range(n - BIG)]
    r = await ask(c, AlterPartitionReassignments(reassignments=moves + unknown))
    assert isinstance(r, AlterPartitionReassignmentsResponse), r
    assert len(r.results) == n
    assert sum(1 for x in r.results if x.error_code is None) == BIG
    # One past it, and one as large as a frame holds: refused by name, nothing applied.
    for body in (
        AlterPartitionReassignments(reassignments=moves + unknown + unknown[:1]),
        frame_full(
            lambda k: AlterPartitionReassignments(
                reassignments=[
                    Reassignment(topic="nosuch", partition=i, replicas=[1]) for i in range(k)
                ]
            )
        ),
    ):
        r = await ask(c, body)
        assert isinstance(r, InvalidRequestError | FrameTooLargeError), r
        assert not r.retriable

    # ListPartitionReassignments: v1 whole (it fits), v2 in pages, and the CLI's walk.
    whole = await ask(c, ListPartitionReassignmentsRequest())
    assert isinstance(whole, ListPartitionReassignmentsResponse)
    listed = {(o.topic, o.partition) for o in whole.reassignments}
    assert listed == {("big", i) for i in range(BIG)}
    paged: list[tuple[str, int]] = []
    req = ListPartitionReassignmentsRequest(v=2, max_bytes=8_000)
    while True:
        page = await ask(c, req)
        assert isinstance(page, ListPartitionReassignmentsResponse), page
        assert len(_encode(page)) <= 8_000
        paged += [(o.topic, o.partition) for o in page.reassignments]
        if page.next_cursor is None:
            break
        req = msgspec.structs.replace(req, cursor=page.next_cursor)
    assert paged == sorted(listed)
    assert set(await ongoing(c, None, 60)) == listed

    # AlterPartitions (a broker's batch): the cap, or the answer's bound; stale items.
    n = largest(MAX_ALTER_PARTITION_ITEMS, 2 * result_bytes("big") + 5)
    item = AlterPartition(
        topic="big", partition=0, leader=1, broker_epoch=epochs[1], partition_epoch=99,
        isr=[IsrMember(broker_id=1, broker_epoch=epochs[1])],
    )  # fmt: skip
    items = [msgspec.structs.replace(item, partition=i % BIG) for i in range(n)]
    r = await ask(c, AlterPartitions(items=items))
    assert isinstance(r, AlterPartitionsResponse) and len(r.results) == n, r
    r = await ask(c, AlterPartitions(items=items + items[:1] * MAX_ALTER_PARTITION_ITEMS))
    assert isinstance(r, InvalidRequestError | FrameTooLargeError), r

    # CreateTopics: the partitions cap in one topic, then as many topics as allowed
    # (each refused alone: no partitions).
    r = await ask(
        c,
        CreateTopicsRequest(
            topics=[CreateTopic(name="c", partitions=10_000, replication_factor=1)]
        ),
    )
    assert isinstance(r, CreateTopicsResponse) and r.results[0].error_code is None, r
    n = largest(MAX_TOPICS_PER_REQUEST, result_bytes("z" * 6))
    empty = [CreateTopic(name=f"z{i:05d}", partitions=0) for i in range(n)]
    r = await ask(c, CreateTopicsRequest(topics=empty))
    assert isinstance(r, CreateTopicsResponse) and len(r.results) == n, r
    r = await ask(c, CreateTopicsRequest(topics=empty * 3))
    assert isinstance(r, InvalidRequestError | FrameTooLargeError), r

    # CreatePartitionsBatch: the partitions cap added to one topic; as many topics.
    r = await ask(c, CreatePartitionsRequest(topics=[CreatePartitions(topic="c", count=20_000)]))
    assert isinstance(r, CreatePartitionsResponse) and r.results[0].error_code is None, r
    grow = [CreatePartitions(topic=f"z{i:05d}", count=2) for i in range(n)]
    r = await ask(c, CreatePartitionsRequest(topics=grow))
    assert isinstance(r, CreatePartitionsResponse) and len(r.results) == n, r

    # DeleteTopics: as many names as allowed (unknown ones, each refused alone).
    r = await ask(c, DeleteTopicsRequest(topics=[f"z{i:05d}" for i in range(n)]))
    assert isinstance(r, DeleteTopicsResponse) and len(r.results) == n, r
    r = await ask(c, DeleteTopicsRequest(topics=[f"z{i:05d}" for i in range(3 * n)]))
    assert isinstance(r, InvalidRequestError | FrameTooLargeError), r

    # IncrementalAlterConfigs: the entry cap (unknown names: refused by name), and past it.
    deletes = [f"x{i}" for i in range(MAX_CONFIG_ENTRIES)]
    r = await ask(
        c, AlterConfigs(resource_type="topic", resource_name="big", delete_configs=deletes)
    )
    assert isinstance(r, Message | MetactlError)
    r = await ask(
        c, AlterConfigs(resource_type="topic", resource_name="big", delete_configs=[*deletes, "y"])
    )
    assert isinstance(r, InvalidRequestError), r

    # ElectPreferredLeaders: a frame-full list (read a budget at a time), and every partition.
    for body in (
        frame_full(
            lambda k: ElectPreferredLeaders(
                partitions=[ReplicaRef("big", i % BIG) for i in range(k)]
            )
        ),
        ElectPreferredLeaders(),
    ):
        r = await ask(c, body)
        assert isinstance(r, ElectPreferredLeadersResponse), r

    # Reads: a whole metadata fetch, DescribeCluster v1 (whole, or refused by name), the rest.
    r = await ask(c, FetchMetadataRequest(from_offset=0, max_records=50_000, max_wait_ms=0))
    assert isinstance(r, FetchMetadataResponse) and r.records, r
    for body in (
        DescribeClusterRequest(),
        DescribeConfigsRequest(resource_type="topic", resource_name="big"),
        DescribeFeaturesRequest(),
        DescribeQuorumRequest(),
        UpdateFeature(name="eligible.leader.replicas.version", level=1),
        ElectLeader(topic="big", partition=0, election_type="preferred"),
    ):
        await ask(c, body)

    # UnregisterBroker: a third broker, registered and never unfenced.
    r3 = await c.request(RegisterBroker(broker_id=3, incarnation_id="b3"))
    assert isinstance(r3, RegisterBrokerResponse)
    await ask(c, UnregisterBroker(broker_id=3))


def test_the_largest_request_of_every_type_keeps_healthy_sessions(tmp_path: Path) -> None:
    proc, address = start(tmp_path / "data")
    try:
        asyncio.run(scenario(address))
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err[-3000:]
