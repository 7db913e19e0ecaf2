"""The single-process baseline: one plain pass over a log, no Spark.

Reads the SQLite log with the stdlib, decodes every batch with msgspec through
`metadata_log.records.decode_batch`, and computes in plain Python what the
``unclean-recoveries`` and ``invariants`` jobs compute (the same `PartitionChecker`).
The benchmark times it against Spark on the same log; tests use it as an independent
cross-check of the Spark jobs' answers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audit.logread import cluster_name, log_info
from audit.rules import LogChecker, Violation
from audit.transactions import committed_batches
from metadata_log.records import PartitionChangeRecord, UncleanRecoveryRecord


@dataclass
class PlainResult:
    records: int = 0
    seconds: float = 0.0
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    partitions: int = 0
    checked: int = 0


def _margin(r: UncleanRecoveryRecord) -> tuple[str, int | None, int | None]:
    """(margin_kind, margin, runner_up) as the Spark job defines them."""
    winner = next((c for c in r.candidates if c.broker_id == r.chosen), None)
    others = [c for c in r.candidates if c.broker_id != r.chosen]
    runner = None
    for c in others:  # best first; the first of equals wins, as a stable sort would
        if runner is None or (c.last_leader_epoch, c.log_end_offset) > (
            runner.last_leader_epoch,
            runner.log_end_offset,
        ):
            runner = c
    if winner is None:
        return "not_reported", None, None if runner is None else runner.broker_id
    if runner is None:
        return "uncontested", None, None
    if winner.last_leader_epoch != runner.last_leader_epoch:
        return "epoch", winner.last_leader_epoch - runner.last_leader_epoch, runner.broker_id
    if winner.log_end_offset != runner.log_end_offset:
        return "offset", winner.log_end_offset - runner.log_end_offset, runner.broker_id
    return "tie", 0, runner.broker_id


def run(
    data_dir: str | Path,
    *,
    recoveries: bool = True,
    invariants: bool = True,
    cluster: str | None = None,
) -> PlainResult:
    """One pass over the log computing the selected audits."""
    started = time.perf_counter()
    info = log_info(data_dir)
    name = cluster if cluster is not None else cluster_name(data_dir)
    out = PlainResult()
    went_offline: dict[tuple[str, int], int] = {}
    checker = LogChecker(name)
    n = 0
    for base, ts, records in committed_batches(info.path, info.start_offset, info.end_offset):
        n += len(records)
        if invariants:
            checker.feed(base, ts, records)
        if not recoveries:
            continue
        for i, r in enumerate(records):
            if type(r) is PartitionChangeRecord:
                if r.leader == -1:
                    went_offline[(r.topic, r.partition)] = ts
            elif type(r) is UncleanRecoveryRecord:
                kind, margin, runner = _margin(r)
                start = went_offline.get((r.topic, r.partition))
                out.recoveries.append(
                    {
                        "cluster": name,
                        "offset": base + i,
                        "topic": r.topic,
                        "partition": r.partition,
                        "strategy": r.strategy,
                        "trigger": r.trigger,
                        "chosen": r.chosen,
                        "runner_up": runner,
                        "margin_kind": kind,
                        "margin": margin,
                        "time_to_recovery_ms": None if start is None else ts - start,
                    }
                )
    for c in checker.finish():
        out.violations.extend(c.out)
        out.checked += c.records
    out.partitions = len(checker.checkers)
    out.records = n
    out.seconds = time.perf_counter() - started
    return out
