"""Wire-fuzzing cases shared by bench/fuzz_wire.py and tests/protocol/test_fuzz_smoke.py.

Owns the seeds (a valid frame of every wire request type, plus responses and
controller-internal tags sent as requests), the structure-aware mutator (msgspec's
untyped MessagePack tree, mutated, re-encoded, with byte-level patches for what the
encoder cannot produce: invalid UTF-8, nesting deeper than its recursion limit), the
codec oracle, and `WireTarget`: a real `ControllerService` on 127.0.0.1 with a seeded
cluster, driven over one raw TCP connection, which checks every answer.

It only sends bytes and reads state: it must not change the service, the codec or the
core, and it configures no logging (its callers do).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, get_args

import msgspec

from controller.core.config import ControllerConfig
from controller.runtime.clock import VirtualClock
from controller.runtime.quota import MutationLimits
from controller.runtime.service import ControllerService
from metactl.errors import InvalidRequestError, MetactlError, UnsupportedVersionError
from protocol.address import parse_address
from protocol.codec import HEADER_BYTES, Frame, decode_frame, encode_frame
from protocol.messages.admin import (
    AlterConfigs,
    AlterConfigsResponse,
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
    DescribeConfigsResponse,
    DescribeFeaturesRequest,
    DescribeFeaturesResponse,
    DescribeQuorumRequest,
    DescribeQuorumResponse,
    ElectLeader,
    ElectPreferredLeaders,
    ElectPreferredLeadersResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    PartitionState,
    Reassignment,
    UnregisterBroker,
    UpdateFeature,
    UpdateFeatureResponse,
)
from protocol.messages.base import ErrorResponse
from protocol.messages.broker_controller import (
    AlterPartition,
    AlterPartitions,
    AlterPartitionsResponse,
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    FetchMetadataRequest,
    FetchMetadataResponse,
    GetReplicaLogInfoRequest,
    IsrMember,
    RegisterBroker,
    RegisterBrokerResponse,
    ReplicaRef,
)
from protocol.messages.data import ProduceRequest, ReadLogRequest
from protocol.messages.internal import Ack
from protocol.messages.plan import (
    PlanRestartRequest,
    PlanRestartResponse,
    PlanRollRequest,
    PlanRollResponse,
)
from protocol.messages.replication import ReplicaFetchRequest
from protocol.messages.unions import Message
from protocol.transport import read_frame

# The seeded cluster: brokers 1..3 registered (at these epochs) and unfenced, and topic
# "t" with 3 partitions, replication factor 3, MinISR 2.
# A broker epoch is its registration's offset: after the two bootstrap records (the ELR
# feature level and the cluster-default min.insync.replicas, docs/lifecycle.md).
SEED_EPOCHS: Final = {1: 2, 2: 4, 3: 6}
SEED_TOPIC: Final = "t"
VIRTUAL_START_MS: Final = 1_700_000_000_000  # frozen: no session expiry, no recovery timer

# What the controller answers each request it serves with (besides an ErrorResponse).
ANSWERS: Final[dict[type[Any], type[Any]]] = {
    RegisterBroker: RegisterBrokerResponse,
    BrokerHeartbeatRequest: BrokerHeartbeatResponse,
    AlterPartition: PartitionState,
    FetchMetadataRequest: FetchMetadataResponse,
    CreateTopicsRequest: CreateTopicsResponse,
    ElectLeader: PartitionState,
    DescribeClusterRequest: DescribeClusterResponse,
    DeleteTopicsRequest: DeleteTopicsResponse,
    CreatePartitionsRequest: CreatePartitionsResponse,
    AlterConfigs: AlterConfigsResponse,
    DescribeConfigsRequest: DescribeConfigsResponse,
    UpdateFeature: UpdateFeatureResponse,
    DescribeFeaturesRequest: DescribeFeaturesResponse,
    AlterPartitionReassignments: AlterPartitionReassignmentsResponse,
    ListPartitionReassignmentsRequest: ListPartitionReassignmentsResponse,
    UnregisterBroker: Ack,
    ElectPreferredLeaders: ElectPreferredLeadersResponse,
    AlterPartitions: AlterPartitionsResponse,
    DescribeQuorumRequest: DescribeQuorumResponse,
    PlanRestartRequest: PlanRestartResponse,
    PlanRollRequest: PlanRollResponse,
}
# Every decode failure is one of these (docs/protocol.md).
DECODE_ERROR_CODES: Final = frozenset({"INVALID_REQUEST", "CORRUPT_MESSAGE"})
CODEC_CODES: Final = DECODE_ERROR_CODES | {"UNSUPPORTED_VERSION"}


def seed_messages() -> list[Message]:
    """A valid message of every wire request type (valid against the seeded cluster),
    and two response types; the controller serves all but the broker-side requests and
    the two responses."""
    e1, e2, e3 = SEED_EPOCHS[1], SEED_EPOCHS[2], SEED_EPOCHS[3]
    t = SEED_TOPIC
    return [
        RegisterBroker(broker_id=4, incarnation_id="i4", rack="r1"),
        RegisterBroker(broker_id=1, incarnation_id="i1-restart", previous_epoch=e1),
        BrokerHeartbeatRequest(broker_id=1, broker_epoch=e1, metadata_offset=10),
        BrokerHeartbeatRequest(broker_id=2, broker_epoch=e2, metadata_offset=10, want_fence=True),
        BrokerHeartbeatRequest(
            broker_id=3, broker_epoch=e3, metadata_offset=10, want_shutdown=True
        ),
        AlterPartition(
            topic=t,
            partition=0,
            leader=1,
            broker_epoch=e1,
            partition_epoch=0,
            isr=[IsrMember(broker_id=1, broker_epoch=e1), IsrMember(broker_id=2, broker_epoch=e2)],
            leader_epoch=0,
        ),
        AlterPartitions(
            items=[
                AlterPartition(
                    topic=t,
                    partition=1,
                    leader=2,
                    broker_epoch=e2,
                    partition_epoch=0,
                    isr=[IsrMember(broker_id=2, broker_epoch=e2)],
                    leader_epoch=0,
                ),
                AlterPartition(
                    topic="nope",
                    partition=0,
                    leader=2,
                    broker_epoch=e2,
                    partition_epoch=0,
                    isr=[IsrMember(broker_id=2, broker_epoch=e2)],
                ),
            ]
        ),
        DescribeQuorumRequest(etcd_members=True),
        FetchMetadataRequest(from_offset=0, max_records=5, max_wait_ms=0),
        CreateTopicsRequest(
            topics=[CreateTopic(name="u", partitions=2, replication_factor=2, min_isr=1)]
        ),
        CreateTopicsRequest(
            topics=[CreateTopic(name="w", assignments=[[1, 2], [2, 3]], recovery_strategy="manual")]
        ),
        ElectLeader(topic=t, partition=1, election_type="preferred"),
        ElectLeader(topic=t, partition=2, election_type="unclean", replica=3),
        DescribeClusterRequest(topic=t),
        # The lifecycle requests (docs/lifecycle.md).
        CreatePartitionsRequest(topics=[CreatePartitions(topic=t, count=4)]),
        AlterConfigs(
            resource_type="topic", resource_name=t, set_configs={"min.insync.replicas": "3"}
        ),
        DescribeConfigsRequest(resource_type="broker", resource_name=""),
        DescribeFeaturesRequest(),
        UpdateFeature(name="eligible.leader.replicas.version", level=1),
        AlterPartitionReassignments(
            reassignments=[
                Reassignment(topic=t, partition=1, replicas=[3, 2, 1]),
                Reassignment(topic=t, partition=2, replicas=None),
            ]
        ),
        ListPartitionReassignmentsRequest(topics=[t]),
        PlanRestartRequest(broker_id=1, limit=10),
        PlanRollRequest(),
        UnregisterBroker(broker_id=2),
        ElectPreferredLeaders(partitions=[ReplicaRef(t, 0), ReplicaRef("nope", 0)]),
        DeleteTopicsRequest(topics=["u", "nope"]),
        GetReplicaLogInfoRequest(broker_id=1, broker_epoch=e1, partitions=[ReplicaRef(t, 0)]),
        ReplicaFetchRequest(
            topic=t,
            partition=0,
            follower_id=2,
            follower_broker_epoch=e2,
            fetch_offset=0,
            last_fetched_epoch=-1,
        ),
        ProduceRequest(topic=t, partition=0, count=3),
        ReadLogRequest(topic=t, partition=0),
        ErrorResponse(code="INVALID_REQUEST", message="a response sent as a request"),
        PartitionState(
            topic=t,
            partition=0,
            replicas=[1, 2, 3],
            leader=1,
            leader_epoch=0,
            partition_epoch=0,
            isr=[1, 2, 3],
        ),
    ]


def seed_payloads() -> list[bytes]:
    """Frame payloads (no length header) of every seed message, and of the controller's
    internal events, which are no wire messages (a client must not fence a broker)."""
    out = [encode_frame(i + 1, m)[HEADER_BYTES:] for i, m in enumerate(seed_messages())]
    for internal in (
        {"type": "FenceBroker", "broker_id": 1},
        {"type": "UnfenceBroker", "broker_id": 2, "broker_epoch": SEED_EPOCHS[2]},
        {"type": "ControlledShutdown", "broker_id": 3, "broker_epoch": SEED_EPOCHS[3]},
    ):
        out.append(msgspec.msgpack.encode([99, internal]))
    return out


# --- the structure-aware mutator --------------------------------------------------------

TAGS: Final = [cls.__struct_config__.tag for cls in get_args(Message)] + [
    "FenceBroker",
    "UnfenceBroker",
    "ReplicaLogInfo",
    "Bogus",
    "",
]
INTERESTING_INTS: Final = [
    0, 1, -1, 2, 3, 4, 7, 255, 256, 65_535, 2**31 - 1, -(2**31), 2**32, 2**53,
    2**63 - 1, -(2**63), 2**64 - 1,
]  # fmt: skip
_WORDS: Final = ["t", "u", "preferred", "unclean", "balanced", "manual", "type", "v", "x" * 300]
# Sentinel strings the encoder can write, patched afterwards into what it cannot.
_BAD_UTF8_MARK: Final = "\ue000\ue001"  # 6 UTF-8 bytes, replaced by 6 invalid ones
_BAD_UTF8_FROM: Final = "\ue000\ue001".encode()
_BAD_UTF8_TO: Final = b"\xff\xfe\xc0\xaf\xed\xa0"
_NEST_MARK: Final = "\ue002\ue003"
_NEST_FROM: Final = b"\xa6" + "\ue002\ue003".encode()  # with its fixstr header


def _value(rnd: random.Random, depth: int = 2) -> Any:
    """A random MessagePack value: often of the wrong type for the field it replaces."""
    kind = rnd.randrange(10 if depth > 0 else 8)
    if kind == 0:
        return None
    if kind == 1:
        return rnd.random() < 0.5
    if kind == 2:
        return rnd.choice(INTERESTING_INTS)
    if kind == 3:
        return rnd.getrandbits(64) - 2**63
    if kind == 4:
        return rnd.choice([0.5, -0.0, float("nan"), float("inf"), 1e308])
    if kind == 5:
        return rnd.choice(_WORDS)
    if kind == 6:
        alphabet = "abc._-0123456789 é\u00ff\u4e2d"
        return "".join(rnd.choice(alphabet) for _ in range(rnd.randrange(12)))
    if kind == 7:
        return rnd.randbytes(rnd.randrange(8))
    if kind == 8:
        return [_value(rnd, depth - 1) for _ in range(rnd.randrange(4))]
    return {rnd.choice(_WORDS): _value(rnd, depth - 1) for _ in range(rnd.randrange(4))}


def _slots(tree: Any) -> list[tuple[Any, Any]]:
    """(container, key) of every node below the root, up to a bound."""
    out: list[tuple[Any, Any]] = []
    stack = [tree]
    while stack and len(out) < 2000:
        node = stack.pop()
        if isinstance(node, list):
            out.extend((node, i) for i in range(len(node)))
            stack.extend(node)
        elif isinstance(node, dict):
            out.extend((node, k) for k in node)
            stack.extend(node.values())
    return out


def _same_type(node: Any, rnd: random.Random) -> Any:
    """Another value of the node's own type: the frame stays decodable and reaches the
    handler with a value it may not expect."""
    if isinstance(node, bool):
        return not node
    if isinstance(node, int):
        near = node + rnd.choice([-2, -1, 1, 2, 10])
        return rnd.choice([near, rnd.choice(INTERESTING_INTS), rnd.randrange(-5, 20)])
    if isinstance(node, str):
        alphabet = "tuvw._-0123456789é"
        fresh = "".join(rnd.choice(alphabet) for _ in range(rnd.randrange(1, 6)))
        return rnd.choice([*_WORDS, "", node + node, node[:-1], fresh])
    if isinstance(node, list) and node:
        i = rnd.randrange(len(node))
        return rnd.choice([node[:i] + node[i + 1 :], [*node, node[i]], node[::-1]])
    return node


def _mutate_tree(tree: Any, rnd: random.Random, op: int | None = None) -> Any:
    slots = _slots(tree)
    op = rnd.randrange(32) if op is None else op
    if not slots or op == 0:
        return _value(rnd) if rnd.random() < 0.5 else [tree, _value(rnd)]
    container, key = rnd.choice(slots)
    tagged = [c for c, k in slots if isinstance(c, dict) and k == "type"]
    if op >= 12:
        if not (isinstance(container, dict) and key in ("type", "v")):
            container[key] = _same_type(container[key], rnd)
    elif op == 1:
        container[key] = _value(rnd)
    elif op == 2:
        container[key] = rnd.choice(INTERESTING_INTS)
    elif op == 3:
        del container[key]
    elif op == 4:
        if isinstance(container, dict):
            container[rnd.choice([*_WORDS, "extra", "topics", "isr"])] = _value(rnd)
        else:
            container.insert(key, _value(rnd))
    elif op == 5 and tagged:
        rnd.choice(tagged)["type"] = rnd.choice(TAGS)
    elif op == 6 and tagged:
        rnd.choice(tagged)["v"] = rnd.choice([0, 2, -1, 2**63 - 1, "1", None])
    elif op == 7:
        container[key] = _NEST_MARK
    elif op == 8:
        container[key] = _BAD_UTF8_MARK
    elif op == 9:
        node = container[key]
        times = rnd.choice([2, 10, 100])
        container[key] = node * times if isinstance(node, list) and node else [node] * times
    elif op == 10 and isinstance(tree, list) and tree:
        tree[0] = rnd.choice([*INTERESTING_INTS, "1", None, 1.5])  # the correlation id
    else:
        container[key] = rnd.choice(INTERESTING_INTS)
    return tree


def decode_tree(payload: bytes) -> Any | None:
    try:
        return msgspec.msgpack.decode(payload)
    except (msgspec.DecodeError, ValueError, RecursionError, TypeError, OverflowError):
        return None


def mutate(payload: bytes, rnd: random.Random, seeds: list[bytes], max_size: int = 4096) -> bytes:
    """A structure-aware mutation of `payload` (or of a seed, if it does not decode)."""
    tree = decode_tree(payload) if rnd.random() > 0.05 else None
    if tree is None:
        tree = decode_tree(rnd.choice(seeds))
    for _ in range(rnd.choice((1, 1, 1, 2, 3))):
        tree = _mutate_tree(tree, rnd)
    if rnd.random() < 0.15:  # what broke issue 11: invalid UTF-8 or deep nesting
        tree = _mutate_tree(tree, rnd, op=rnd.choice((7, 8)))
    try:
        out = msgspec.msgpack.encode(tree)
    except (TypeError, ValueError, OverflowError, RecursionError):
        out = rnd.choice(seeds)
    out = out.replace(_BAD_UTF8_FROM, _BAD_UTF8_TO)
    if _NEST_FROM in out:
        depth = rnd.choice([16, 200, 1000, 5000])
        out = out.replace(_NEST_FROM, b"\x91" * depth + b"\xc0", 1).replace(_NEST_FROM, b"\xc0")
    r = rnd.random()
    if r < 0.05 and out:
        out = out[: rnd.randrange(len(out))]  # truncated
    elif r < 0.08:
        out += rnd.randbytes(rnd.randint(1, 8))  # trailing bytes
    elif r < 0.12 and out:
        i = rnd.randrange(len(out))
        out = out[:i] + bytes([rnd.randrange(256)]) + out[i + 1 :]
    return out[:max_size]


# --- oracles ------------------------------------------------------------------------------


class WireViolation(AssertionError):
    """An answer or a state that breaks the wire contract (docs/protocol.md)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


def check_codec(payload: bytes) -> str:
    """Decode one payload: the body's type name, or the coded error's code. Raises
    WireViolation for a wrong code or a frame that does not re-encode to itself; any
    other exception escapes as it is (that is a crash)."""
    try:
        frame = decode_frame(payload)
    except MetactlError as exc:
        if exc.code not in CODEC_CODES:
            raise WireViolation("wrong_code", f"{exc.code} from decode_frame") from None
        return exc.code
    again = decode_frame(encode_frame(frame.correlation_id, frame.body)[HEADER_BYTES:])
    if again != frame:
        raise WireViolation("round_trip", f"{frame!r} re-decoded as {again!r}")
    return type(frame.body).__name__


class Hang(Exception):
    """No answer within the deadline."""


@dataclass
class Outcome:
    request: str  # the body's type name, "undecodable" or "unsupported_version"
    answer: str  # the answer's type name, or its error code
    rejected: bool


class WireTarget:
    """A real controller service with a seeded cluster, spoken to over one raw TCP
    connection. `exchange` sends one frame payload and checks the answer."""

    def __init__(self, data_dir: Path, *, max_frame_bytes: int = 64 * 1024) -> None:
        self.data_dir = data_dir
        self.max_frame_bytes = max_frame_bytes
        self.service: ControllerService | None = None
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def start(self) -> None:
        # Virtual time that never moves: no session expires and no recovery timer fires,
        # so only the request under test can change the log.
        self.service = ControllerService(
            self.data_dir,
            "127.0.0.1:0",
            config=ControllerConfig(),
            clock=VirtualClock(VIRTUAL_START_MS),
            max_frame_bytes=self.max_frame_bytes,
            # The mutation quota stays on but never runs dry: time does not move, so a
            # spent bucket would refuse every later CreateTopics and ElectLeaders. The
            # cap on partitions per request stays at its default.
            mutation_limits=MutationLimits(rate=10**9),
        )
        await self.service.start()
        for broker_id, epoch in SEED_EPOCHS.items():
            reg = await self._ask_ok(RegisterBroker(broker_id=broker_id, incarnation_id="seed"))
            assert isinstance(reg, RegisterBrokerResponse) and reg.broker_epoch == epoch
            hb = BrokerHeartbeatRequest(broker_id=broker_id, broker_epoch=epoch, metadata_offset=99)
            await self._ask_ok(hb)
        spec = CreateTopic(name=SEED_TOPIC, partitions=3, replication_factor=3, min_isr=2)
        created = await self._ask_ok(CreateTopicsRequest(topics=[spec]))
        assert isinstance(created, CreateTopicsResponse) and created.results[0].error_code is None

    async def stop(self) -> None:
        await self._disconnect()
        if self.service is not None:
            await self.service.stop()

    @property
    def log_end(self) -> tuple[int, int]:
        """(durable end offset, end offset of the newest image, committed or not)."""
        svc = self.service
        assert svc is not None and svc.store is not None
        return svc.store.end_offset, svc.controller.image.end_offset

    async def _ask_ok(self, body: Message) -> Message:
        frame = await self._ask(encode_frame(1, body)[HEADER_BYTES:])
        assert not isinstance(frame.body, ErrorResponse), frame.body
        return frame.body

    async def _ask(self, payload: bytes) -> Frame:
        if self._conn is None:
            assert self.service is not None
            self._conn = await asyncio.open_connection(*parse_address(self.service.address))
        reader, writer = self._conn
        writer.write(struct.pack(">I", len(payload)) + payload)
        await writer.drain()
        return decode_frame(await read_frame(reader, 1 << 30))

    async def _disconnect(self) -> None:
        if self._conn is not None:
            _, writer = self._conn
            self._conn = None
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    def _classify(self, payload: bytes) -> tuple[bytes, str, int, Message | None]:
        """What the receiver will make of the payload, by the same codec: (the payload to
        send, the request label, the correlation id the answer must carry, the body)."""
        try:
            frame = decode_frame(payload)
        except UnsupportedVersionError as exc:
            return payload, "unsupported_version", exc.correlation_id, None
        except InvalidRequestError:
            return payload, "undecodable", 0, None
        body = frame.body
        if isinstance(body, FetchMetadataRequest) and body.max_wait_ms > 0:
            # A long poll at the end of the log waits (by design) up to 10 s for a
            # commit; the fuzzer asks without waiting. tests/service covers the wait.
            body = msgspec.structs.replace(body, max_wait_ms=0)
            payload = encode_frame(frame.correlation_id, body)[HEADER_BYTES:]
        return payload, type(body).__name__, frame.correlation_id, body

    async def exchange(self, payload: bytes, timeout_s: float = 5.0) -> Outcome:
        """Send one payload (framed with its true length) and check the answer: an
        ErrorResponse with a decode code for an undecodable frame; for a decoded one, the
        response its type gets or a coded ErrorResponse (never UNKNOWN_SERVER_ERROR),
        under its correlation id; and, if it was rejected, an unchanged log end.
        Raises WireViolation or Hang."""
        payload, label, cid, body = self._classify(payload)
        before = self.log_end
        try:
            async with asyncio.timeout(timeout_s):
                answer = await self._ask(payload)
        except TimeoutError:
            await self._disconnect()
            raise Hang(f"no answer to {label} within {timeout_s} s") from None
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            await self._disconnect()
            raise WireViolation("closed", f"connection closed after {label}: {exc!r}") from None
        reply = answer.body
        got = reply.code if isinstance(reply, ErrorResponse) else type(reply).__name__
        if answer.correlation_id != cid:
            raise WireViolation("bad_answer", f"{label} answered under {answer.correlation_id}")
        if isinstance(reply, ErrorResponse):
            if reply.code == MetactlError.code:
                raise WireViolation("unknown_server_error", f"{label}: {reply.message}")
            if body is None and reply.code not in (
                DECODE_ERROR_CODES if label == "undecodable" else {"UNSUPPORTED_VERSION"}
            ):
                raise WireViolation("bad_answer", f"{label} answered {reply.code}")
            if body is not None and type(body) not in ANSWERS and reply.code != "INVALID_REQUEST":
                raise WireViolation("bad_answer", f"{label} answered {reply.code}")
        elif body is None or ANSWERS.get(type(body)) is not type(reply):
            raise WireViolation("bad_answer", f"{label} answered {got}")
        rejected = isinstance(reply, ErrorResponse) or (
            isinstance(
                reply,
                CreateTopicsResponse
                | DeleteTopicsResponse
                | CreatePartitionsResponse
                | AlterPartitionReassignmentsResponse
                | AlterPartitionsResponse,
            )
            and all(r.error_code is not None for r in reply.results)
        )
        after = self.log_end
        if rejected and after != before:
            raise WireViolation(
                "state_change", f"{label} answered {got} but the log end moved {before} -> {after}"
            )
        return Outcome(label, got, rejected)
