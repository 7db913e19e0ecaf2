"""eventfeed/: the committed log as one readable line per event, from records the real
controller core wrote (the worked example 5.3.3), a transaction applied whole (and an
aborted one never), configs and an ELR clear in slices, `--since` replaying quietly, and
the `--since` parser. The other lifecycle lines, from a real controller, are in
tests/ops/test_lifecycle_cli.py."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from controller.core.config import ControllerConfig
from eventfeed.feed import Feed, iso_ms
from metactl.errors import InvalidConfigurationError
from metadata_log.records import (
    BROKER_RESOURCE,
    MIN_ISR_CONFIG,
    TOPIC_RESOURCE,
    AbortTransactionRecord,
    BeginTransactionRecord,
    ClearElrRecord,
    ConfigRecord,
    EndTransactionRecord,
    FenceBrokerRecord,
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
)
from ops.times import parse_duration_ms, parse_since
from tests.controller.testkit import Cluster


@dataclass(frozen=True)
class E:
    offset: int
    timestamp_ms: int
    record: MetadataRecord


def entries(records: list[MetadataRecord], start: int = 0, ts: int = 1_000) -> list[E]:
    return [E(start + i, ts + i, r) for i, r in enumerate(records)]


def worked_example() -> list[MetadataRecord]:
    """5.3.3: RF 3, MinISR 2; brokers 1, 2, 3 fenced in turn, 2 and 3 return uncleanly,
    and the balanced recovery chooses 2 of LastKnownELR [2,3]."""
    c = Cluster(ControllerConfig(unclean_recovery_strategy="balanced"))
    c.start(1, 2, 3)
    c.create("demo", replication_factor=3, min_isr=2)
    for b in (1, 2, 3):
        c.fence(b)
    c.restart(1, clean=False)
    c.register(2)
    c.unfence(2)
    c.register(3)
    c.unfence(3)
    c.answer(2, 0, 12, topic="demo")
    c.answer(3, 0, 10, topic="demo")
    assert c.view("demo") == (2, [2], [], [])
    return list(c.log)


def test_the_worked_example_reads_as_the_outage_it_was() -> None:
    texts = [e.text for e in Feed().add(entries(worked_example()))]
    expected = [
        "broker 1 registered at epoch 0 (first registration)",
        "topic demo created: 1 partition(s), MinISR 2",
        "broker 1 fenced (session expired)",
        "demo-0 leader 1→2 (isr), isr [1,2,3]→[2,3]",
        "demo-0 leader 2→3 (isr), isr [2,3]→[3], elr []→[2]",
        "demo-0 OFFLINE: leader 3→none (fence), isr [3]→[], elr [2]→[2,3]",
        "broker 2 registered at epoch",  # ... (UNCLEAN restart: out of ISR and ELR)
        "demo-0 elr [2,3]→[3], LastKnownELR []→[2] (unclean_registration of broker 2)",
        "demo-0 UNCLEAN RECOVERY: chose 2 of LastKnownELR [2,3] (balanced) — potential data loss",
        "demo-0 leader none→2 (unclean_recovery), isr []→[2], LastKnownELR [2,3]→[], recovering",
    ]

    def where(w: str) -> int:
        first = "first registration"
        return next(
            i for i, t in enumerate(texts) if t.startswith(w) and (first in w or first not in t)
        )

    at = [where(w) for w in expected]
    assert at == sorted(at), texts
    assert "(UNCLEAN restart: out of ISR and ELR)" in texts[at[6]]
    # Records that say nothing new give no line: PartitionRecords (the topic's line says
    # them) and the fence of an already fenced broker (no record at all).
    assert not any(t.startswith("demo-0 (") for t in texts)


def test_a_transaction_gives_its_lines_only_at_its_end_and_an_aborted_one_none() -> None:
    feed = Feed()
    brokers: list[MetadataRecord] = [
        RegisterBrokerRecord(broker_id=1, incarnation_id="a", broker_epoch=0),
        UnfenceBrokerRecord(broker_id=1, broker_epoch=0),
    ]
    assert len(feed.add(entries(brokers))) == 2
    created: list[MetadataRecord] = [
        BeginTransactionRecord(name="CreateTopic big"),
        TopicRecord(name="big", topic_id="x", partitions=2, min_isr=1),
        PartitionRecord(topic="big", partition=0, replicas=[1], isr=[1], leader=1),
        PartitionRecord(topic="big", partition=1, replicas=[1], isr=[1], leader=1),
    ]
    # The transaction arrives in two reads: nothing before its end marker; reading goes on
    # after what was read, held or not.
    assert feed.add(entries(created[:2], start=2)) == []
    assert feed.next_offset == 4
    assert feed.add(entries(created[2:], start=4)) == []
    assert feed.next_offset == 6
    assert "big" not in feed.image.topics
    done = feed.add(entries([EndTransactionRecord()], start=6))
    assert [(e.offset, e.text) for e in done] == [
        (3, "topic big created: 2 partition(s), MinISR 1 (id x)")
    ]
    assert "big" in feed.image.topics
    aborted: list[MetadataRecord] = [
        BeginTransactionRecord(name="CreateTopic gone"),
        TopicRecord(name="gone", topic_id="y", partitions=1, min_isr=1),
        AbortTransactionRecord(reason="writer failed"),
        FenceBrokerRecord(broker_id=1, broker_epoch=0, reason="operator"),
    ]
    after = feed.add(entries(aborted, start=7))
    assert [e.text for e in after] == ["broker 1 fenced (operator)"]
    assert "gone" not in feed.image.topics


def test_configs_and_an_elr_clear_in_slices_read_as_what_they_changed() -> None:
    """A large topic's clear comes as ranges (one per work budget, in one transaction):
    each line says its range, and the MinISR the partitions now have, min(config, RF)."""
    records: list[MetadataRecord] = [
        RegisterBrokerRecord(broker_id=1, incarnation_id="a", broker_epoch=0),
        ConfigRecord(
            resource_type=BROKER_RESOURCE, resource_name="", name=MIN_ISR_CONFIG, value="2"
        ),
        TopicRecord(name="big", topic_id="x", partitions=5),  # no MinISR of its own
        *[
            PartitionRecord(topic="big", partition=i, replicas=[1], isr=[1], leader=1)
            for i in range(5)
        ],
        ConfigRecord(resource_type=TOPIC_RESOURCE, resource_name="big", name=MIN_ISR_CONFIG,
                     value="3"),
        BeginTransactionRecord(name="AlterConfigs big"),
        ClearElrRecord(topic="big", min_isr=3, first=0, end=2),
        ClearElrRecord(topic="big", min_isr=3, first=2, end=4),
        ClearElrRecord(topic="big", min_isr=3, first=4, end=5),
        EndTransactionRecord(),
        ConfigRecord(resource_type=TOPIC_RESOURCE, resource_name="big", name=MIN_ISR_CONFIG),
        ClearElrRecord(topic="big"),  # no MinISR: the partitions keep theirs
        ConfigRecord(
            resource_type=BROKER_RESOURCE, resource_name="", name=MIN_ISR_CONFIG, value="1"
        ),
    ]  # fmt: skip
    texts = [e.text for e in Feed().add(entries(records))]
    capped = ", MinISR 1 (min.insync.replicas 3, capped at RF 1)"
    assert texts[1:] == [
        "cluster default min.insync.replicas=2",
        "topic big created: 5 partition(s), MinISR 2 (cluster default) (id x)",
        "topic big: min.insync.replicas=3 (was the cluster default)",
        "topic big: ELR and LastKnownELR cleared on partitions 0..1" + capped,
        "topic big: ELR and LastKnownELR cleared on partitions 2..3" + capped,
        "topic big: ELR and LastKnownELR cleared on partition 4" + capped,
        "topic big: min.insync.replicas deleted (was 3): the cluster default applies",
        "topic big: ELR and LastKnownELR cleared on all 5 partition(s)",
        "cluster default min.insync.replicas=1 (was 2)",
    ]


def test_since_replays_earlier_records_without_lines() -> None:
    records = worked_example()
    all_events = Feed().add(entries(records))
    recovery = next(e for e in all_events if "UNCLEAN RECOVERY" in e.text)
    # Only what happened from the recovery on; the line still knows the LastKnownELR.
    feed = Feed(since_ms=recovery.timestamp_ms)
    later = feed.add(entries(records))
    assert later[0].text == recovery.text
    assert [e.offset for e in later] == [
        e.offset for e in all_events if e.offset >= recovery.offset
    ]
    assert feed.image.partitions[("demo", 0)].leader == 2


def test_a_line_has_the_commit_time_in_utc() -> None:
    (event,) = Feed().add(
        entries(
            [RegisterBrokerRecord(broker_id=4, incarnation_id="a", broker_epoch=0)],
            ts=1_700_000_000_123,
        )
    )
    assert (
        event.line()
        == "2023-11-14T22:13:20.123Z  broker 4 registered at epoch 0 (first registration)"
    )
    assert iso_ms(0) == "1970-01-01T00:00:00.000Z"


def test_since_takes_a_duration_or_a_time() -> None:
    now = 1_700_000_000_000
    assert parse_since("10m", now) == now - 600_000
    assert parse_since("2h", now) == now - 7_200_000
    assert parse_since("1d", now) == now - 86_400_000
    assert parse_since("1.5s", now) == now - 1_500
    assert parse_since("2023-11-14T22:13:20Z", now) == 1_700_000_000_000
    assert parse_since("2023-11-14T22:13:20", now) == 1_700_000_000_000  # UTC by default
    assert parse_since("20231114", now) == parse_since("2023-11-14", now) == 1_699_920_000_000
    # The audits' windows also take epoch milliseconds; a bare number is a date or nothing.
    assert parse_since(" 1700000000000 ", now, epoch_ms=True) == 1_700_000_000_000
    assert parse_since("2023-11-14T22:13:20+01:00", now, epoch_ms=True) == 1_699_996_400_000
    with pytest.raises(InvalidConfigurationError, match=r"--until 'x': .* or epoch milli"):
        parse_since("x", now, "--until", epoch_ms=True)
    assert parse_duration_ms("500ms", "--x") == 500
    assert parse_duration_ms("0", "--x") == parse_duration_ms("0s", "--x") == 0  # no unit
    with pytest.raises(InvalidConfigurationError, match="--x '5'"):
        parse_duration_ms("5", "--x")  # any other number needs one
    for bad in ("ten minutes", "10", "-5m", ""):
        with pytest.raises(InvalidConfigurationError, match="--since"):
            parse_since(bad, now)
