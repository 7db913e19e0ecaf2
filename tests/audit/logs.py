"""Logs with known answers for the audit tests.

Scenario logs come from the real controller (`simulation.scenario.run_scenario`). The crafted
log is written with `SqliteLogStore` directly: one topic per rule, each with its own
brokers (so that one partition's unclean registrations cannot touch another's), whose
records break exactly that rule, plus topics that must *not* be flagged.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Final

from metadata_log.records import (
    ChangeReason,
    ClearElrRecord,
    ElectionKind,
    LeaderRecoveryState,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RecoveryCandidate,
    RegisterBrokerRecord,
    TopicRecord,
    UncleanRecoveryRecord,
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
    finally:
        await store.close()
    return list(EXPECTED)
