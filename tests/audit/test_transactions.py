"""The audits leave out aborted and unfinished transactions (`audit.transactions`).

The log is real: a controller on a SQLite store whose medium refuses the fence's second
batch, so that the fence's begin marker and first batch are durable, then the retried
fence commits after the abort marker. Read naively, the retry repeats the aborted
part's epochs (``epoch_regression``); each test also runs with the filter disabled and
checks that the finding then appears (the planted bug).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import audit.spark
import audit.transactions
from audit import plain
from audit.export import export_parquet
from audit.export_layout import Manifest
from audit.jobs import invariants
from audit.spark import AuditInput
from audit.transactions import OPEN_END, aborted_ranges, committed
from controller.runtime.clock import VirtualClock
from controller.runtime.driver import Controller
from metactl.errors import StorageError
from metadata_log.records import (
    AbortTransactionRecord,
    BeginTransactionRecord,
    EndTransactionRecord,
    NoOpRecord,
)
from protocol.messages.admin import CreateTopic
from protocol.messages.broker_controller import RegisterBroker
from protocol.messages.internal import FenceBroker, UnfenceBroker
from tests.metadata_log.log_fixtures import FailingStore


async def _aborted_fence_log(data_dir: Path) -> None:
    store = await FailingStore.open(data_dir)
    assert isinstance(store, FailingStore)
    ctl = await Controller.open(store, clock=VirtualClock(), max_batch_bytes=4096)
    try:
        for b in (1, 2, 3):
            r: Any = await ctl.submit(RegisterBroker(broker_id=b, incarnation_id=f"b{b}"))
            await ctl.submit(UnfenceBroker(broker_id=b, broker_epoch=r.broker_epoch))
        await ctl.submit(CreateTopic(name="t", partitions=200, replication_factor=3, min_isr=2))
        store.fail_on = frozenset({store.writes + 2})  # the fence's second batch
        with pytest.raises(StorageError):
            await ctl.submit(FenceBroker(broker_id=1))
        await ctl.submit(FenceBroker(broker_id=1))  # abort marker, then the retry
    finally:
        await ctl.close()
        await store.close()


@pytest.fixture(scope="module")
def aborted_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("txn") / "txn"
    asyncio.run(_aborted_fence_log(path))
    return path


def _regressions(violations: list[Any]) -> int:
    return sum(v.rule == "epoch_regression" for v in violations)


def test_ranges_and_stream_leave_out_aborted_and_unfinished_transactions() -> None:
    b, e, a, x = (
        BeginTransactionRecord(name="t"),
        EndTransactionRecord(),
        AbortTransactionRecord(reason="r"),
        NoOpRecord(),
    )
    # offsets: 0 x | 1 b 2 x | 3 x 4 a 5 x | 6 b 7 x 8 e | 9 x 10 b | 11 x
    batches: list[tuple[int, int, list[Any]]] = [
        (0, 1, [x]),
        (1, 2, [b, x]),
        (3, 3, [x, a, x]),
        (6, 4, [b, x, e]),
        (9, 5, [x, b]),
    ]
    batches.append((11, 6, [x]))
    kept = [base + i for base, _, rs in committed(batches) for i in range(len(rs))]
    assert kept == [0, 5, 6, 7, 8, 9]
    markers = [(1, "BeginTransaction"), (4, "AbortTransaction"), (6, "BeginTransaction")]
    markers += [(8, "EndTransaction"), (10, "BeginTransaction")]
    assert aborted_ranges(markers) == [(1, 4), (10, OPEN_END)]
    # Stray end/abort markers are ignored.
    assert aborted_ranges([(0, "EndTransaction"), (1, "AbortTransaction")]) == []


def test_plain_audit_ignores_the_aborted_fence(
    aborted_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    res = plain.run(aborted_log)
    assert res.violations == []
    # Planted bug: without the filter, the retry looks like epochs going backwards.
    monkeypatch.setattr(audit.transactions, "committed", lambda batches: batches)
    naive = plain.run(aborted_log)
    assert _regressions(naive.violations) > 0
    assert naive.records > res.records


def test_spark_invariants_ignore_the_aborted_fence(
    spark: Any, aborted_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inp = AuditInput.of(str(aborted_log))
    assert len(inp.aborted(spark)[aborted_log.name]) == 1
    for method in ("rows", "logs"):
        res = invariants.run(spark, inp, method=method)
        assert res.stats["violations"] == 0, (method, res.summary)
    # Planted bug: the row path with no ranges to leave out.
    monkeypatch.setattr(AuditInput, "aborted", lambda self, spark: {})
    naive = invariants.run(spark, AuditInput.of(str(aborted_log)), method="rows")
    assert naive.stats["by_rule"].get("epoch_regression", 0) > 0


def test_the_export_resolves_transactions_across_tasks(
    spark: Any, aborted_log: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Export tasks cut the aborted transaction apart; the manifest's ranges are what a
    scan of the markers finds, and the buckets method leaves those records out."""
    pq = tmp_path / "pq"
    report = export_parquet([str(aborted_log)], pq, task_records=50, buckets=2)
    assert report.files > 3  # several tasks, each with its own files
    inp = AuditInput.of(parquet=str(pq))
    manifest = inp.manifest()
    assert manifest is not None
    scanned = AuditInput.of(str(aborted_log)).aborted(spark)
    assert manifest.aborted() == scanned and len(scanned[aborted_log.name]) == 1
    assert invariants.run(spark, inp, method="buckets").stats["violations"] == 0
    # Planted bug: a manifest that lost the ranges.
    monkeypatch.setattr(Manifest, "aborted", lambda self: {})
    naive = invariants.run(spark, AuditInput.of(parquet=str(pq)), method="buckets")
    assert naive.stats["by_rule"].get("epoch_regression", 0) > 0


def test_many_aborted_ranges_become_a_range_join(
    spark: Any, aborted_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past a few ranges, rows are left out by a broadcast range join, not a chain of
    conditions: the same rows either way."""
    inp = AuditInput.of(str(aborted_log))
    kept = sorted(r["offset"] for r in inp.load(spark, ["offset"]).collect())
    everything = inp.load(spark, ["offset"], include_aborted=True).count()
    assert 0 < len(kept) < everything
    monkeypatch.setattr(audit.spark, "OUTSIDE_CONDITION_RANGES", 0)
    joined = AuditInput.of(str(aborted_log))
    plan = joined.load(spark, ["offset"])
    assert "BroadcastHashJoin" in plan._jdf.queryExecution().executedPlan().toString()
    assert sorted(r["offset"] for r in plan.collect()) == kept
    assert invariants.run(spark, joined, method="rows").stats["violations"] == 0
