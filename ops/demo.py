"""`metactl demo --data-dir D`: the smallest real run of metactl, used by `make run`.

Until the controller exists this exercises the durable log end to end: it opens (or
creates) the SQLite log in the data directory, appends a handful of realistic records,
closes it, reopens it read-only, verifies every CRC and offset, and dumps it. It is
re-runnable: on a log that already holds the demo cluster it re-registers the brokers
(as after a clean restart) and moves the demo partition's ISR, so every run appends.

The few decisions below (which epoch a broker presents, which ISR comes next) are demo
scripting, not controller rules; the controller will own the real ones.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from metadata_log.records import (
    ChangeReason,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
)
from metadata_log.store import LogStore
from ops.log_cmds import format_entry, run_command

BROKERS = (1, 2, 3)
TOPIC = "orders"
PARTITIONS = 3
MIN_ISR = 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="append a few realistic records to the log, then reopen, verify and dump it",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument("--data-dir", required=True, type=Path, help="data directory")
    parser.set_defaults(func=_demo)


@dataclass
class _Seen:
    """What the demo needs to know about an existing log."""

    broker_epochs: dict[int, int] = field(default_factory=dict)
    topics: set[str] = field(default_factory=set)
    # (topic, partition) -> (isr, leader, leader_epoch, partition_epoch)
    partitions: dict[tuple[str, int], tuple[list[int], int, int, int]] = field(default_factory=dict)


async def _scan(store: LogStore) -> _Seen:
    seen = _Seen()
    async for entry in store.iter_entries(store.start_offset):
        record = entry.record
        if isinstance(record, RegisterBrokerRecord):
            seen.broker_epochs[record.broker_id] = record.broker_epoch
        elif isinstance(record, TopicRecord):
            seen.topics.add(record.name)
        elif isinstance(record, PartitionRecord):
            seen.partitions[(record.topic, record.partition)] = (
                record.isr,
                record.leader,
                record.leader_epoch,
                record.partition_epoch,
            )
        elif isinstance(record, PartitionChangeRecord):
            key = (record.topic, record.partition)
            if key in seen.partitions:
                isr, leader, _, _ = seen.partitions[key]
                seen.partitions[key] = (
                    isr if record.isr is None else record.isr,
                    leader if record.leader is None else record.leader,
                    record.leader_epoch,
                    record.partition_epoch,
                )
    return seen


async def run_demo(data_dir: Path, out: TextIO | None = None) -> int:
    from metadata_log.sqlite_store import SqliteLogStore

    def say(text: str) -> None:
        print(text, file=sys.stdout if out is None else out)

    say(f"metactl demo: data dir {data_dir}")
    async with await SqliteLogStore.open(data_dir) as store:
        if store.end_offset == store.start_offset:
            say(f"opened {store.location}: new, empty log")
        else:
            say(
                f"opened {store.location}: {store.end_offset - store.start_offset} records "
                f"already, offsets [{store.start_offset}, {store.end_offset})"
            )
        seen = await _scan(store)

        # Brokers register; broker_epoch is the offset of the registration record.
        base = store.end_offset
        registrations: list[MetadataRecord] = []
        for i, broker in enumerate(BROKERS):
            previous = seen.broker_epochs.get(broker)
            registrations.append(
                RegisterBrokerRecord(
                    broker_id=broker,
                    incarnation_id=str(uuid.uuid4()),
                    broker_epoch=base + i,
                    endpoint=f"broker-{broker}:9092",
                    rack=f"rack-{'abc'[(broker - 1) % 3]}",
                    previous_epoch=previous,
                    clean=previous is not None,
                )
            )
        offsets = await store.append(registrations)
        verb = "re-registered (clean restart)" if seen.broker_epochs else "registered"
        say(f"{verb} brokers {', '.join(map(str, BROKERS))} at offsets {_span(offsets)}")
        unfences: list[MetadataRecord] = [
            UnfenceBrokerRecord(broker_id=b, broker_epoch=base + i) for i, b in enumerate(BROKERS)
        ]
        offsets = await store.append(unfences)
        say(f"unfenced them at offsets {_span(offsets)}")

        if TOPIC not in seen.topics:
            created: list[MetadataRecord] = [
                TopicRecord(
                    name=TOPIC, topic_id=str(uuid.uuid4()), partitions=PARTITIONS, min_isr=MIN_ISR
                )
            ]
            for p in range(PARTITIONS):
                replicas = [BROKERS[(p + k) % len(BROKERS)] for k in range(len(BROKERS))]
                created.append(
                    PartitionRecord(
                        topic=TOPIC,
                        partition=p,
                        replicas=replicas,
                        isr=replicas,
                        leader=replicas[0],
                        min_isr=MIN_ISR,
                    )
                )
                seen.partitions[(TOPIC, p)] = (replicas, replicas[0], 0, 0)
            offsets = await store.append(created)
            say(f"created topic {TOPIC!r} with {PARTITIONS} partitions at offsets {_span(offsets)}")

        # Partition 0 alternates: broker 3 drops out of the ISR, then catches up again.
        isr, _leader, leader_epoch, partition_epoch = seen.partitions[(TOPIC, 0)]
        if 3 in isr:
            new_isr, what = [b for b in isr if b != 3], "shrank"
        else:
            new_isr, what = sorted([*isr, 3]), "expanded"
        change = PartitionChangeRecord(
            topic=TOPIC,
            partition=0,
            reason=ChangeReason.ALTER_PARTITION,
            partition_epoch=partition_epoch + 1,
            leader_epoch=leader_epoch,
            isr=new_isr,
            broker=3,
        )
        offsets = await store.append([change])
        say(f"{what} the ISR of {TOPIC}-0 to {new_isr} at offset {offsets[0]}")
    say(f"closed the log (end offset {store.end_offset})")

    async with await SqliteLogStore.open(data_dir, read_only=True, verify_tail=False) as store:
        report = await store.verify()
        say(
            f"reopened read-only and verified: {report.records} records in {report.batches} "
            f"batches, offsets [{report.start_offset}, {report.end_offset}), CRCs and "
            f"continuity ok"
        )
        say("log:")
        async for chunk in store.iter_chunks(store.start_offset):
            for entry in chunk:
                say("  " + format_entry(entry, as_json=False))
    return 0


def _span(offsets: range) -> str:
    return f"{offsets.start}..{offsets.stop - 1}" if len(offsets) > 1 else str(offsets.start)


def _demo(args: argparse.Namespace) -> int:
    return run_command(lambda: run_demo(args.data_dir))
