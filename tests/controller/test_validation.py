"""Field validation (controller/core/validation.py): every request field in the range Kafka
gives it, refused with a named error before any record, through the one event step.

The values are those of the outside review (issue 11): the no-leader sentinel -1 as a
broker id, 2^63-1 and 2^64-1, the topic name "abc\\n", min.insync.replicas 2^64-1, and
10,000-character endpoints and racks."""

from __future__ import annotations

from typing import TypeVar

import msgspec
import pytest

from controller.core import validation
from controller.core.validation import INT16_MAX, INT32_MAX, INT64_MAX, INT64_MIN
from metactl.errors import (
    InvalidConfigurationError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    MetactlError,
    StaleBrokerEpochError,
)
from protocol.messages.admin import CreateTopic, ElectLeader
from protocol.messages.broker_controller import (
    AlterPartition,
    BrokerHeartbeatRequest,
    IsrMember,
    RegisterBroker,
)
from protocol.messages.internal import (
    ControlledShutdown,
    FenceBroker,
    ReplicaLogInfo,
    UnfenceBroker,
)

from .testkit import Cluster

BAD_IDS = [-1, -(2**31), INT32_MAX + 1, INT64_MAX, 2**64 - 1]
BAD_INT32 = [INT32_MAX + 1, -(2**31) - 1, INT64_MAX, 2**64 - 1]
BAD_INT64 = [INT64_MAX + 1, 2**64 - 1, INT64_MIN - 1]
LONG = "x" * 10_000
T = TypeVar("T", bound=msgspec.Struct)


def cluster() -> Cluster:
    """Brokers 1-3 active; topic t: replicas [1,2,3], leader 1, MinISR 2."""
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2, 3]], min_isr=2)
    return c


def refused(c: Cluster, request: object, error: type[MetactlError] = InvalidRequestError) -> str:
    """Submit through the step; assert the named error, no record and an unchanged image.
    Returns the message."""
    log, image = list(c.log), c.image
    with pytest.raises(MetactlError) as raised:
        c.submit(request)  # type: ignore[arg-type]
    assert type(raised.value) is error, raised.value
    assert c.log == log and c.image is image
    return raised.value.message


# --- broker ids, everywhere a request names a broker --------------------------------------


@pytest.mark.parametrize("bad", BAD_IDS)
def test_registration_refuses_broker_ids_outside_int32_and_the_sentinel(bad: int) -> None:
    c = cluster()
    message = refused(c, RegisterBroker(broker_id=bad, incarnation_id="x"))
    assert f"broker_id {bad} is outside 0..{INT32_MAX}" in message


@pytest.mark.parametrize("good", [0, INT32_MAX])
def test_registration_accepts_the_bounds(good: int) -> None:
    c = cluster()
    c.register(good)
    assert good in c.image.brokers


@pytest.mark.parametrize("bad", BAD_IDS)
def test_every_request_naming_a_broker_refuses_a_bad_id(bad: int) -> None:
    c = cluster()
    e = c.epoch(1)
    p = c.p()
    for request in (
        BrokerHeartbeatRequest(broker_id=bad, broker_epoch=e, metadata_offset=0),
        FenceBroker(broker_id=bad),
        UnfenceBroker(broker_id=bad, broker_epoch=e),
        ControlledShutdown(broker_id=bad, broker_epoch=e),
        ElectLeader(topic="t", partition=0, election_type="unclean", replica=bad),
        ElectLeader(topic="t", partition=0, election_type="preferred", replica=bad),
        ReplicaLogInfo(
            broker_id=bad,
            broker_epoch=e,
            topic="t",
            partition=0,
            last_leader_epoch=0,
            log_end_offset=0,
        ),
        AlterPartition(
            topic="t",
            partition=0,
            leader=bad,
            broker_epoch=e,
            partition_epoch=p.partition_epoch,
            isr=[IsrMember(broker_id=1, broker_epoch=e)],
        ),
        AlterPartition(
            topic="t",
            partition=0,
            leader=1,
            broker_epoch=e,
            partition_epoch=p.partition_epoch,
            isr=[IsrMember(broker_id=1, broker_epoch=e), IsrMember(broker_id=bad, broker_epoch=0)],
        ),
    ):
        assert str(bad) in refused(c, request)


@pytest.mark.parametrize("bad", BAD_IDS)
def test_an_assignment_naming_a_bad_broker_id_is_an_invalid_replica_assignment(bad: int) -> None:
    c = cluster()
    message = refused(
        c, CreateTopic(name="u", assignments=[[1, 2], [2, bad]]), InvalidReplicaAssignmentError
    )
    assert f"partition 1: broker id(s) [{bad}] outside 0..{INT32_MAX}" in message


# --- int32 and int64 fields ----------------------------------------------------------------


@pytest.mark.parametrize("bad", BAD_INT32)
def test_int32_fields(bad: int) -> None:
    c = cluster()
    e, p = c.epoch(1), c.p()
    alter = AlterPartition(
        topic="t",
        partition=0,
        leader=1,
        broker_epoch=e,
        partition_epoch=p.partition_epoch,
        leader_epoch=p.leader_epoch,
        isr=[IsrMember(broker_id=1, broker_epoch=e)],
    )
    for field in ("partition", "partition_epoch", "leader_epoch"):
        assert field in refused(c, _with(alter, **{field: bad}))
    assert "partition" in refused(
        c, ElectLeader(topic="t", partition=bad, election_type="preferred")
    )
    info = ReplicaLogInfo(
        broker_id=1, broker_epoch=e, topic="t", partition=0, last_leader_epoch=0, log_end_offset=0
    )
    for field in ("partition", "last_leader_epoch"):
        assert field in refused(c, _with(info, **{field: bad}))


@pytest.mark.parametrize("bad", BAD_INT64)
def test_int64_fields(bad: int) -> None:
    c = cluster()
    e, p = c.epoch(1), c.p()
    alter = AlterPartition(
        topic="t",
        partition=0,
        leader=1,
        broker_epoch=e,
        partition_epoch=p.partition_epoch,
        isr=[IsrMember(broker_id=1, broker_epoch=e)],
    )
    assert "broker_epoch" in refused(c, _with(alter, broker_epoch=bad))
    assert "isr broker_epoch" in refused(
        c, _with(alter, isr=[IsrMember(broker_id=1, broker_epoch=bad)])
    )
    heartbeat = BrokerHeartbeatRequest(broker_id=1, broker_epoch=e, metadata_offset=0)
    for field in ("broker_epoch", "metadata_offset"):
        assert field in refused(c, _with(heartbeat, **{field: bad}))
    assert "broker_epoch" in refused(c, UnfenceBroker(broker_id=1, broker_epoch=bad))
    assert "broker_epoch" in refused(c, ControlledShutdown(broker_id=1, broker_epoch=bad))
    info = ReplicaLogInfo(
        broker_id=1, broker_epoch=e, topic="t", partition=0, last_leader_epoch=0, log_end_offset=0
    )
    for field in ("broker_epoch", "log_end_offset"):
        assert field in refused(c, _with(info, **{field: bad}))
    assert "previous_broker_epoch" in refused(
        c, RegisterBroker(broker_id=4, incarnation_id="x", previous_epoch=bad)
    )


def test_in_range_values_pass_validation_and_meet_the_semantic_checks() -> None:
    """-1 epochs (Kafka's "unknown") and the int64 extremes are in range: the handlers'
    own checks answer them, as before."""
    c = cluster()
    hb = BrokerHeartbeatRequest(broker_id=1, broker_epoch=INT64_MIN, metadata_offset=INT64_MAX)
    assert "current epoch" in refused(c, hb, StaleBrokerEpochError)
    c.register(4, previous_epoch=-1)
    assert 4 in c.image.brokers


# --- registration strings --------------------------------------------------------------------


@pytest.mark.parametrize(
    "endpoint",
    [
        LONG,
        "x" * 251 + ":9092",  # 256 characters: one over the limit
        "host",
        ":9092",
        "host:",
        "host:0",
        "host:65536",
        "host:123456",
        "host:90a2",
        "ho st:9092",
        "host:9092\n",
        "hôst:9092",
    ],
)
def test_bad_endpoints(endpoint: str) -> None:
    c = cluster()
    refused(c, RegisterBroker(broker_id=4, incarnation_id="x", endpoint=endpoint))


@pytest.mark.parametrize(
    "endpoint", ["", "127.0.0.1:1", "broker-4.example.com:65535", "[::1]:9092", "x" * 250 + ":9092"]
)
def test_good_endpoints(endpoint: str) -> None:
    c = cluster()
    c.run(RegisterBroker(broker_id=4, incarnation_id="x", endpoint=endpoint))
    assert c.image.brokers[4].endpoint == endpoint


def test_rack_and_incarnation_are_capped_and_printable() -> None:
    c = cluster()
    assert "rack is 10000 characters; the limit is 255" in refused(
        c, RegisterBroker(broker_id=4, incarnation_id="x", rack=LONG)
    )
    assert "non-printable" in refused(
        c, RegisterBroker(broker_id=4, incarnation_id="x", rack="rack-a\n")
    )
    assert "incarnation_id is 10000 characters" in refused(
        c, RegisterBroker(broker_id=4, incarnation_id=LONG)
    )
    c.register(4, rack="r" * 255, incarnation="i" * 255)
    assert c.image.brokers[4].rack == "r" * 255


# --- CreateTopic ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["abc\n", "\nabc", "a" * 250, "", ".", "..", "a b", "t/1"])
def test_topic_names_must_match_in_full(name: str) -> None:
    c = cluster()
    message = refused(c, CreateTopic(name=name, replication_factor=1), InvalidTopicError)
    assert "a name is 1-249 characters of [a-zA-Z0-9._-]" in message


def test_a_very_long_topic_name_is_not_echoed() -> None:
    c = cluster()
    message = refused(c, CreateTopic(name=LONG, replication_factor=1), InvalidTopicError)
    assert "of 10000 chars" in message and LONG not in message


@pytest.mark.parametrize("min_isr", [0, -1, INT32_MAX + 1, 2**64 - 1])
def test_min_isr_outside_int32(min_isr: int) -> None:
    c = cluster()
    request = CreateTopic(name="u", replication_factor=1, min_isr=min_isr)
    assert f"within 1..{INT32_MAX}, got {min_isr}" in refused(c, request, InvalidConfigurationError)


def test_min_isr_above_the_rf_is_accepted_and_capped() -> None:
    # Kafka accepts it; each partition's effective MinISR is min(config, its RF).
    c = cluster()
    c.create("u", replication_factor=2, min_isr=3)
    assert c.image.topics["u"].min_isr == 3
    assert c.image.partitions[("u", 0)].min_isr == 2
    c.create("w", assignments=[[1, 2, 3], [2]], min_isr=2)
    assert [c.image.partitions[("w", i)].min_isr for i in (0, 1)] == [2, 1]


@pytest.mark.parametrize("partitions", [0, -1, INT32_MAX + 1, 2**64 - 1])
def test_partition_count(partitions: int) -> None:
    c = cluster()
    e = refused(
        c,
        CreateTopic(name="u", partitions=partitions, replication_factor=1),
        InvalidPartitionsError,
    )
    assert str(partitions) in e


@pytest.mark.parametrize("rf", [0, -1, 4, INT16_MAX + 1, 2**64 - 1])
def test_replication_factor(rf: int) -> None:
    c = cluster()
    refused(c, CreateTopic(name="u", replication_factor=rf), InvalidReplicationFactorError)


def test_replication_factor_is_bounded_by_int16_even_with_more_brokers() -> None:
    with pytest.raises(InvalidReplicationFactorError, match=f"1..{INT16_MAX}"):
        validation.check_replication_factor(INT16_MAX + 1, INT16_MAX + 10)
    validation.check_replication_factor(INT16_MAX, INT16_MAX + 10)


def _with(request: T, **changes: object) -> T:
    return msgspec.structs.replace(request, **changes)


# --- AlterPartition: a replica named twice ---------------------------------------------------


@pytest.mark.parametrize("copies", [2, 100_000])
def test_an_isr_naming_a_broker_twice_is_an_invalid_request(copies: int) -> None:
    # As Kafka: refused, not silently de-duplicated (issue 22; 100,000 copies were accepted).
    c = cluster()
    e, p = c.epoch(1), c.p()
    member = IsrMember(broker_id=2, broker_epoch=c.epoch(2))
    alter = AlterPartition(
        topic="t",
        partition=0,
        leader=1,
        broker_epoch=e,
        partition_epoch=p.partition_epoch,
        isr=[IsrMember(broker_id=1, broker_epoch=e), *[member] * copies],
    )
    assert "isr lists broker 2 more than once" in refused(c, alter)
    # The same ISR without the repeat is accepted (a shrink of [1,2,3] to [1,2]).
    c.submit(_with(alter, isr=[IsrMember(broker_id=1, broker_epoch=e), member]))
    assert c.p().isr == {1, 2}
