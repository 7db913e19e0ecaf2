"""Logs with known answers for the audit tests.

Scenario logs come from the real controller (`simulation.scenario.run_scenario`). The crafted
log is written with `SqliteLogStore` directly: one topic per rule, each with its own
brokers (so that one partition's unclean registrations cannot touch another's), whose
records break exactly that rule, plus topics that must *not* be flagged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

from metadata_log.records import (
    ELR_FEATURE,
    MIN_ISR_CONFIG,
    BeginTransactionRecord,
    ChangeReason,
    ClearElrRecord,
    ConfigRecord,
    ElectionKind,
    EndTransactionRecord,
    FeatureLevelRecord,
    LeaderRecoveryState,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RecoveryCandidate,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UncleanRecoveryRecord,
    UnregisterBrokerRecord,
)
from metadata_log.sqlite_store import SqliteLogStore
from simulation.scenario import run_scenario
from simulation.scenario_format import load_scenario

ROOT: Final = Path(__file__).resolve().parents[2]
SCENARIOS: Final = {p.stem: p for p in sorted((ROOT / "simulation" / "scenarios").glob("*.yaml"))}


def run_scenario_log(path: Path, data_dir: Path) -> Path:
    """Run a shipped scenario into `data_dir`; returns it (its name is the cluster name)."""
    _, summary = asyncio.run(run_scenario(load_scenario(path), data_dir))
    assert summary.failed_expectations == 0, f"{path.stem} no longer holds"
    return data_dir


def _register(broker: int, offset: int, *, clean: bool = True) -> RegisterBrokerRecord:
    return RegisterBrokerRecord(
        broker_id=broker,
        incarnation_id=f"b{broker}@{offset}",
        broker_epoch=offset,
        clean=clean,
        fenced=False,
    )


def _change(
    topic: str, pe: int, le: int, reason: ChangeReason, **kw: object
) -> PartitionChangeRecord:
    return PartitionChangeRecord(
        topic=topic,
        partition=0,
        reason=reason,
        partition_epoch=pe,
        leader_epoch=le,
        **kw,  # type: ignore[arg-type]
    )


# (topic, replicas, min_isr) of every crafted partition; the rule each one breaks (or None).
CRAFTED: Final = {
    "leader-outside": "leader_not_in_isr_or_elr",
    "overlap": "isr_elr_overlap",
    "elr-at-min-isr": "elr_at_or_above_min_isr",
    "unclean-into-isr": "unclean_replica_in_isr",
    "unclean-stays-in-elr": "unclean_replica_in_elr",
    "unclean-back-in-elr": "unclean_replica_in_elr",
    "unrecorded-recovery": "unrecorded_unclean_recovery",
    "epoch-regression": "epoch_regression",
    "healthy-recovery": None,
    "healthy-rejoin": None,
    "healthy-clear-elr": None,
    # The metadata lifecycle (issue 19).
    "elr-after-downgrade": "elr_while_disabled",
    "elr-never-cleared": "elr_while_disabled",
    "healthy-downgrade": None,
    "removed-replica-kept": "member_outside_replicas",
    "adding-into-isr": "adding_replica_in_isr",
    "adding-elected": "adding_replica_elected",  # and leader_not_in_isr_or_elr
    "unregistered-kept": "unregistered_broker_kept",
    "clear-range-outside": "elr_at_or_above_min_isr",
    "healthy-reassign": None,
    "healthy-cancel": None,
    "healthy-unregister": None,
    "healthy-recreated": None,
    "healthy-clear-min-isr": None,
    "healthy-deleted": None,
}

# Offsets (in the crafted log) and brokers of the expected violations are checked by the
# tests against `expected_crafted`, computed while writing.
EXPECTED: list[tuple[str, int, str, int | None]] = []


async def crafted_violations(data_dir: Path) -> list[tuple[str, int, str, int | None]]:
    """Write the crafted log; returns the expected (topic, offset, rule, broker) list."""
    EXPECTED.clear()
    store = await SqliteLogStore.open(data_dir)
    offset = 0
    ts = 1_767_225_600_000  # 2026-01-01T00:00:00Z

    async def put(*records: MetadataRecord, dt: int = 1000) -> int:
        nonlocal offset, ts
        ts += dt
        first = offset
        await store.append(list(records), timestamp_ms=ts)
        offset += len(records)
        return first

    def expect(topic: str, at: int, rule: str, broker: int | None) -> None:
        EXPECTED.append((topic, at, rule, broker))

    async def topic(
        name: str, replicas: list[int], min_isr: int, isr: list[int] | None = None
    ) -> None:
        base = offset
        await put(
            *[_register(b, base + i) for i, b in enumerate(replicas)],
            TopicRecord(name=name, topic_id=name, partitions=1, min_isr=min_isr),
            PartitionRecord(
                topic=name,
                partition=0,
                replicas=replicas,
                isr=isr if isr is not None else replicas,
                leader=(isr if isr is not None else replicas)[0],
                min_isr=min_isr,
            ),
        )

    try:
        await lifecycle_feature_histories(put, expect, topic, lambda: offset)
        # A leader elected outside ISR ∪ ELR.
        await topic("leader-outside", [1, 2, 3], 2)
        at = await put(
            _change(
                "leader-outside",
                1,
                1,
                ChangeReason.ELECTION,
                election=ElectionKind.ISR,
                leader=3,
                isr=[1, 2],
            )
        )
        expect("leader-outside", at, "leader_not_in_isr_or_elr", 3)

        # A replica in both ISR and ELR (|ISR| < MinISR, so only the overlap is wrong).
        await topic("overlap", [4, 5, 6], 3)
        at = await put(_change("overlap", 1, 0, ChangeReason.FENCE, isr=[4, 5], elr=[5]))
        expect("overlap", at, "isr_elr_overlap", 5)

        # An ELR kept while the ISR is at MinISR.
        await topic("elr-at-min-isr", [7, 8, 9], 2)
        at = await put(_change("elr-at-min-isr", 1, 0, ChangeReason.FENCE, isr=[7, 8], elr=[9]))
        expect("elr-at-min-isr", at, "elr_at_or_above_min_isr", None)

        # An uncleanly registered replica back in the ISR by an unfence (no AlterPartition).
        await topic("unclean-into-isr", [10, 11, 12], 2)
        await put(_change("unclean-into-isr", 1, 0, ChangeReason.FENCE, isr=[10, 11], broker=12))
        await put(_register(12, offset, clean=False))
        at = await put(
            _change("unclean-into-isr", 2, 0, ChangeReason.UNFENCE, isr=[10, 11, 12], broker=12)
        )
        expect("unclean-into-isr", at, "unclean_replica_in_isr", 12)

        # An ELR member registers uncleanly and is never moved to the LastKnownELR: flagged
        # at the registration, since the log ends with it still in the ELR.
        await topic("unclean-stays-in-elr", [13, 14, 15], 2)
        await put(_change("unclean-stays-in-elr", 1, 0, ChangeReason.FENCE, isr=[13], elr=[14, 15]))
        at = await put(_register(14, offset, clean=False))
        expect("unclean-stays-in-elr", at, "unclean_replica_in_elr", 14)

        # Moved to the LastKnownELR correctly, then back into a new ELR without rejoining
        # the ISR by AlterPartition.
        await topic("unclean-back-in-elr", [16, 17, 18], 2)
        await put(_change("unclean-back-in-elr", 1, 0, ChangeReason.FENCE, isr=[16], elr=[17, 18]))
        await put(
            _register(17, offset, clean=False),
            _change(
                "unclean-back-in-elr",
                2,
                0,
                ChangeReason.UNCLEAN_REGISTRATION,
                elr=[18],
                last_known_elr=[17],
                broker=17,
            ),
        )
        at = await put(_change("unclean-back-in-elr", 3, 0, ChangeReason.FENCE, elr=[17, 18]))
        expect("unclean-back-in-elr", at, "unclean_replica_in_elr", 17)

        # An unclean-recovery change with no UncleanRecoveryRecord before it.
        await topic("unrecorded-recovery", [19, 20, 21], 2)
        await put(
            _change(
                "unrecorded-recovery", 1, 1, ChangeReason.FENCE, leader=-1, isr=[], elr=[19, 20]
            )
        )
        at = await put(
            _change(
                "unrecorded-recovery",
                2,
                2,
                ChangeReason.UNCLEAN_RECOVERY,
                election=ElectionKind.UNCLEAN_RECOVERY,
                leader=21,
                isr=[21],
                elr=[],
                recovery_state=LeaderRecoveryState.RECOVERING,
            )
        )
        expect("unrecorded-recovery", at, "unrecorded_unclean_recovery", 21)

        # A partition epoch that does not advance.
        await topic("epoch-regression", [22, 23, 24], 2)
        at = await put(
            _change("epoch-regression", 0, 0, ChangeReason.ALTER_PARTITION, isr=[22, 23])
        )
        expect("epoch-regression", at, "epoch_regression", None)

        # Healthy: a recorded unclean recovery electing a replica outside ISR ∪ ELR.
        await topic("healthy-recovery", [25, 26, 27], 2)
        await put(
            _change(
                "healthy-recovery",
                1,
                1,
                ChangeReason.FENCE,
                leader=-1,
                isr=[],
                elr=[],
                last_known_elr=[26, 27],
            )
        )
        await put(_register(27, offset, clean=False))
        await put(
            UncleanRecoveryRecord(
                topic="healthy-recovery",
                partition=0,
                strategy="balanced",
                candidates=[
                    RecoveryCandidate(broker_id=26, last_leader_epoch=0, log_end_offset=5),
                    RecoveryCandidate(broker_id=27, last_leader_epoch=1, log_end_offset=3),
                ],
                chosen=27,
                trigger="isr_and_elr_empty",
                offline_since_ms=ts,
            ),
            _change(
                "healthy-recovery",
                2,
                2,
                ChangeReason.UNCLEAN_RECOVERY,
                election=ElectionKind.UNCLEAN_RECOVERY,
                leader=27,
                isr=[27],
                last_known_elr=[],
                recovery_state=LeaderRecoveryState.RECOVERING,
            ),
            dt=60_000,
        )

        # Healthy: an unclean replica rejoins by AlterPartition, may then join the ELR.
        await topic("healthy-rejoin", [28, 29, 30], 2)
        await put(_change("healthy-rejoin", 1, 0, ChangeReason.FENCE, isr=[28, 29], broker=30))
        await put(_register(30, offset, clean=False))
        await put(_change("healthy-rejoin", 2, 0, ChangeReason.ALTER_PARTITION, isr=[28, 29, 30]))
        await put(_change("healthy-rejoin", 3, 0, ChangeReason.FENCE, isr=[28], elr=[29, 30]))

        # Healthy: min.insync.replicas changed; ClearElr empties the ELR and bumps the epoch.
        await topic("healthy-clear-elr", [31, 32, 33], 2)
        await put(_change("healthy-clear-elr", 1, 0, ChangeReason.FENCE, isr=[31], elr=[32]))
        await put(ClearElrRecord(topic="healthy-clear-elr"))
        await put(_change("healthy-clear-elr", 3, 0, ChangeReason.ALTER_PARTITION, isr=[31, 33]))

        await lifecycle_histories(put, expect, topic, lambda: offset)
    finally:
        await store.close()
    return list(EXPECTED)


# --- the metadata lifecycle (issue 19) ------------------------------------------------

Put = Callable[..., Awaitable[int]]
Expect = Callable[[str, int, str, int | None], None]
NewTopic = Callable[..., Awaitable[None]]


async def lifecycle_feature_histories(
    put: Put, expect: Expect, topic: NewTopic, offset: Callable[[], int]
) -> None:
    """First in the log: an eligible.leader.replicas.version downgrade reaches every
    partition that exists, so only these three exist when it happens (the feature is back
    at 1 before any other topic is created)."""
    await put(FeatureLevelRecord(name=ELR_FEATURE, level=1))
    # Three partitions with an ELR (ISR below MinISR 3).
    for name, (a, b, c) in (
        ("elr-after-downgrade", (101, 102, 103)),
        ("elr-never-cleared", (104, 105, 106)),
        ("healthy-downgrade", (107, 108, 109)),
    ):
        await topic(name, [a, b, c], 3)
        await put(_change(name, 1, 0, ChangeReason.FENCE, isr=[a, b], elr=[c], broker=c))
    # The downgrade clears two of them; "elr-never-cleared" is left with its ELR.
    downgrade = await put(
        BeginTransactionRecord(name="downgrade"),
        FeatureLevelRecord(name=ELR_FEATURE, level=0),
        ClearElrRecord(topic="elr-after-downgrade"),
        ClearElrRecord(topic="healthy-downgrade"),
        EndTransactionRecord(),
    )
    expect("elr-never-cleared", downgrade + 1, "elr_while_disabled", None)
    # With tracking off, a change puts an ELR member back: flagged at that change.
    at = await put(_change("elr-after-downgrade", 3, 0, ChangeReason.FENCE, isr=[101], elr=[102]))
    expect("elr-after-downgrade", at, "elr_while_disabled", None)
    # Healthy: the classic rule (no ELR) while tracking is off.
    await put(_change("healthy-downgrade", 3, 0, ChangeReason.FENCE, isr=[107], broker=108))
    await put(FeatureLevelRecord(name=ELR_FEATURE, level=1))


async def lifecycle_histories(
    put: Put, expect: Expect, topic: NewTopic, offset: Callable[[], int]
) -> None:
    """Reassignment, unregistration, deletion and ClearElr ranges, each broken once, and
    the healthy shapes the real controller writes (`controller.core.lifecycle`)."""

    def move(
        name: str, pe: int, le: int, replicas: list[int], adding: list[int], **kw: object
    ) -> PartitionChangeRecord:
        removing = kw.pop("removing", [])
        return _change(
            name,
            pe,
            le,
            ChangeReason.REASSIGNMENT,
            replicas=replicas,
            adding_replicas=adding,
            removing_replicas=removing,
            **kw,
        )

    # A reassignment [40,41,42] -> [41,42,43] completes but broker 40, removed, keeps its
    # ISR membership.
    await topic("removed-replica-kept", [40, 41, 42], 2)
    await put(_register(43, offset()))
    await put(move("removed-replica-kept", 1, 0, [41, 42, 43, 40], [43], removing=[40]))
    await put(
        _change("removed-replica-kept", 2, 0, ChangeReason.ALTER_PARTITION, isr=[40, 41, 42, 43])
    )
    at = await put(
        move(
            "removed-replica-kept",
            3,
            1,
            [41, 42, 43],
            [],
            election=ElectionKind.ISR,
            leader=41,
        )
    )
    expect("removed-replica-kept", at, "member_outside_replicas", 40)

    # The reassignment's start puts the new replica straight into the ISR.
    await topic("adding-into-isr", [44, 45, 46], 2)
    await put(_register(47, offset()))
    at = await put(
        move("adding-into-isr", 1, 0, [45, 46, 47, 44], [47], removing=[44], isr=[44, 45, 46, 47])
    )
    expect("adding-into-isr", at, "adding_replica_in_isr", 47)

    # The new replica, not caught up, is elected.
    await topic("adding-elected", [48, 49, 50], 2)
    await put(_register(51, offset()))
    await put(move("adding-elected", 1, 0, [49, 50, 51, 48], [51], removing=[48]))
    at = await put(
        _change("adding-elected", 2, 1, ChangeReason.ELECTION, election=ElectionKind.ISR, leader=51)
    )
    expect("adding-elected", at, "adding_replica_elected", 51)
    expect("adding-elected", at, "leader_not_in_isr_or_elr", 51)

    # An unregistered broker left in the ELR: no change of the unregistration removed it.
    await topic("unregistered-kept", [52, 53, 54], 3)
    await put(
        _change("unregistered-kept", 1, 0, ChangeReason.FENCE, isr=[52, 53], elr=[54], broker=54)
    )
    at = await put(
        BeginTransactionRecord(name="unregister"),
        UnregisterBrokerRecord(broker_id=54, broker_epoch=offset() - 3),
        EndTransactionRecord(),
    )
    expect("unregistered-kept", at + 1, "unregistered_broker_kept", 54)
    await put(_change("unregistered-kept", 2, 0, ChangeReason.ALTER_PARTITION, isr=[52, 53]))

    # A ClearElr over partitions [1, end) leaves partition 0's ELR: once its ISR is back at
    # MinISR the ELR must be empty, and is not (the checker honours the range).
    await topic("clear-range-outside", [61, 62, 63], 2)
    await put(_change("clear-range-outside", 1, 0, ChangeReason.FENCE, isr=[61], elr=[62]))
    await put(ClearElrRecord(topic="clear-range-outside", first=1, end=3))
    at = await put(_change("clear-range-outside", 2, 0, ChangeReason.ALTER_PARTITION, isr=[61, 63]))
    expect("clear-range-outside", at, "elr_at_or_above_min_isr", None)

    # Healthy: a reassignment that completes once the new replica caught up (leadership
    # moves off the removed replica in the completing change).
    await topic("healthy-reassign", [64, 65, 66], 2)
    await put(_register(67, offset()))
    await put(move("healthy-reassign", 1, 0, [65, 66, 67, 64], [67], removing=[64]))
    await put(_change("healthy-reassign", 2, 0, ChangeReason.ALTER_PARTITION, isr=[64, 65, 66, 67]))
    await put(
        move(
            "healthy-reassign",
            3,
            1,
            [65, 66, 67],
            [],
            isr=[65, 66, 67],
            election=ElectionKind.ISR,
            leader=65,
        )
    )

    # Healthy: a reassignment cancelled before its new replica caught up.
    await topic("healthy-cancel", [68, 69, 70], 2)
    await put(_register(71, offset()))
    await put(move("healthy-cancel", 1, 0, [69, 70, 71, 68], [71], removing=[68]))
    await put(move("healthy-cancel", 2, 0, [69, 70, 68], []))

    # Healthy: a fenced broker unregistered, leaving the ELR in the same transaction.
    await topic("healthy-unregister", [72, 73, 74], 3)
    await put(
        _change("healthy-unregister", 1, 0, ChangeReason.FENCE, isr=[72, 73], elr=[74], broker=74)
    )
    await put(
        BeginTransactionRecord(name="unregister"),
        UnregisterBrokerRecord(broker_id=74, broker_epoch=offset() - 3),
        _change("healthy-unregister", 2, 0, ChangeReason.UNREGISTER, elr=[], broker=74),
        EndTransactionRecord(),
    )
    await put(_change("healthy-unregister", 3, 0, ChangeReason.ALTER_PARTITION, isr=[72, 73]))

    # Healthy: a topic deleted and created again under its name is a new topic. The old
    # one's broker 77 registered uncleanly while out of its ISR; the new topic's replica on
    # 77 is a fresh one, in the ISR from its creation (mixing the two would flag it).
    await topic("healthy-recreated", [75, 76, 77], 2)
    await put(_change("healthy-recreated", 1, 0, ChangeReason.FENCE, isr=[75, 76], broker=77))
    await put(_register(77, offset(), clean=False))
    await put(_change("healthy-recreated", 5, 3, ChangeReason.ELECTION, leader=76))
    await put(RemoveTopicRecord(topic_id="healthy-recreated", name="healthy-recreated"))
    await put(
        TopicRecord(name="healthy-recreated", topic_id="healthy-recreated-2", partitions=1),
        PartitionRecord(
            topic="healthy-recreated",
            partition=0,
            replicas=[75, 76, 77],
            isr=[75, 76, 77],
            leader=75,
            min_isr=2,
        ),
    )
    await put(_change("healthy-recreated", 1, 0, ChangeReason.FENCE, isr=[75, 77], broker=76))

    # Healthy: min.insync.replicas raised to 5 on RF 3: the effective MinISR is 3, so an
    # ISR of two with an ELR is right (under the old MinISR 2 it would be flagged).
    await topic("healthy-clear-min-isr", [78, 79, 80], 2)
    await put(
        ConfigRecord(
            resource_type="topic",
            resource_name="healthy-clear-min-isr",
            name=MIN_ISR_CONFIG,
            value="5",
        ),
        ClearElrRecord(topic="healthy-clear-min-isr", min_isr=5),
    )
    await put(_change("healthy-clear-min-isr", 2, 0, ChangeReason.FENCE, isr=[78, 79], elr=[80]))

    # Healthy: a topic deleted for good, its leader away from the preferred replica.
    await topic("healthy-deleted", [81, 82, 83], 2)
    await put(
        _change(
            "healthy-deleted", 1, 1, ChangeReason.ELECTION, election=ElectionKind.ISR, leader=82
        )
    )
    await put(RemoveTopicRecord(topic_id="healthy-deleted", name="healthy-deleted"))
