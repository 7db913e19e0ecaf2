"""Large histories by tiling: a log copied k times, each copy an independent sub-cluster.

Simulating 100M records through the controller core takes hours; tiling a simulated
history takes minutes. Copy k of the base log is appended with its broker ids shifted by
``k * BROKER_STRIDE``, its topic names (and ids) prefixed ``c{k}-``, its broker epochs
shifted past the records written so far, and its timestamps by k times the base's span
plus a day: the tiled log is k healthy sub-clusters one after another, which every audit
reads as one cluster (the answers of a tile are those of the base, shifted).

Used by the benchmarks (`bench/spark_audit.py`, `bench/spark_cluster.py`) and the
cluster test. Records of a lifecycle (deletes, reassignments, unregistrations, configs)
are shifted too; a feature level is cluster-wide and is copied as is.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Final

import msgspec

from audit.logread import iter_batches, log_info, log_time_bounds
from metadata_log.records import (
    BrokerRegistrationChangeRecord,
    ClearElrRecord,
    ConfigRecord,
    FenceBrokerRecord,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RecoveryCandidate,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UncleanRecoveryRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
    decode_batch,
)
from metadata_log.sqlite_store import SqliteLogStore

BROKER_STRIDE: Final = 1000
DAY_MS: Final = 86_400_000


def shift_record(r: MetadataRecord, k: int, shift: int) -> MetadataRecord:
    """Copy k of a record: brokers + k*STRIDE, topics prefixed, broker epochs + shift."""
    if k == 0:
        return r
    db = k * BROKER_STRIDE
    rep = msgspec.structs.replace

    def topic(name: str) -> str:
        return f"c{k}-{name}"

    def ids(values: list[int] | None) -> list[int] | None:
        return None if values is None else [b + db for b in values]

    def one(b: int) -> int:
        return b + db if b >= 0 else b

    match r:
        case PartitionChangeRecord():
            return rep(
                r,
                topic=topic(r.topic),
                leader=None if r.leader is None else one(r.leader),
                isr=ids(r.isr),
                elr=ids(r.elr),
                last_known_elr=ids(r.last_known_elr),
                broker=None if r.broker is None else one(r.broker),
                replicas=ids(r.replicas),
                adding_replicas=ids(r.adding_replicas),
                removing_replicas=ids(r.removing_replicas),
            )
        case PartitionRecord():
            return rep(
                r,
                topic=topic(r.topic),
                replicas=[b + db for b in r.replicas],
                isr=[b + db for b in r.isr],
                elr=[b + db for b in r.elr],
                last_known_elr=[b + db for b in r.last_known_elr],
                leader=one(r.leader),
                adding_replicas=[b + db for b in r.adding_replicas],
                removing_replicas=[b + db for b in r.removing_replicas],
            )
        case RegisterBrokerRecord():
            return rep(
                r,
                broker_id=r.broker_id + db,
                incarnation_id=f"c{k}-{r.incarnation_id}",
                broker_epoch=r.broker_epoch + shift,
                previous_epoch=None if r.previous_epoch is None else r.previous_epoch + shift,
            )
        case (
            FenceBrokerRecord()
            | UnfenceBrokerRecord()
            | BrokerRegistrationChangeRecord()
            | UnregisterBrokerRecord()
        ):
            return rep(r, broker_id=r.broker_id + db, broker_epoch=r.broker_epoch + shift)
        case UncleanRecoveryRecord():
            return rep(
                r,
                topic=topic(r.topic),
                chosen=one(r.chosen),
                candidates=[
                    RecoveryCandidate(
                        broker_id=c.broker_id + db,
                        last_leader_epoch=c.last_leader_epoch,
                        log_end_offset=c.log_end_offset,
                        broker_epoch=c.broker_epoch + shift,
                    )
                    for c in r.candidates
                ],
            )
        case TopicRecord():
            return rep(r, name=topic(r.name), topic_id=f"c{k}-{r.topic_id}")
        case RemoveTopicRecord():
            return rep(r, name=topic(r.name), topic_id=f"c{k}-{r.topic_id}")
        case ClearElrRecord():
            return rep(r, topic=topic(r.topic))
        case ConfigRecord() if r.resource_type == "topic":
            return rep(r, resource_name=topic(r.resource_name))
    return r


async def _tile(base: Path, out: Path, target: int) -> int:
    info = log_info(base)
    first, last = log_time_bounds(info.path)
    if first is None or last is None:
        raise ValueError(f"{base} holds no records to tile")
    period = last - first + DAY_MS
    store = await SqliteLogStore.open(out)
    written = 0
    try:
        k = 0
        while written < target:
            shift = written
            pending = []
            for chunk in iter_batches(info.path, info.start_offset, info.end_offset):
                for _base, count, ts, payload in chunk:
                    if written >= target:
                        break
                    records = [shift_record(r, k, shift) for r in decode_batch(payload)]
                    pending.append(store.append(records, timestamp_ms=ts + k * period))
                    written += count
                    if len(pending) >= 2000:
                        await asyncio.gather(*pending)
                        pending = []
            if pending:
                await asyncio.gather(*pending)
            k += 1
    finally:
        await store.close()
    return written


def tile_log(base: str | Path, out: str | Path, records: int) -> int:
    """Write at least `records` records (whole stored batches) of tiled copies of the log
    in `base` to a new log in `out`; returns the records written."""
    return asyncio.run(_tile(Path(base), Path(out), records))
