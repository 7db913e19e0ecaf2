"""``metactl simulate faults``: seeded fault schedules against the real controller step
and the real replication logic, with an oracle of every acknowledged record.

`run_faults` generates `schedules` schedules from one seed (`faults_schedule.generate`),
runs each in a `faults_sim.FaultSim` and sums what they found into a `FaultsSummary`:
acknowledged records, and of those the ones lost and reported (an unclean recovery, or a
classic unclean election, committed after the acknowledgement), in an ELR mode the ones
a leader elected under the classic rules of a feature cycle's downgrade window may have
overwritten (the classic rules' documented loss, counted apart), the ones lost silently
(no such report: a broken durability guarantee) and the ones of topics deleted since
(not checked), the partition-seconds spent without a leader, the unclean recoveries,
the lifecycle operations interleaved with the faults (config changes, reassignments,
partition additions, deletes; applied and refused) and what became of the
reassignments, and any violation of the audit's invariants. A failing schedule is
shrunk (`shrink`: drop one fault or lifecycle op at a time while it still fails, then
try a quiet network) and written as a replay file for ``--replay``. The scenario
format of ``metactl scenario run`` cannot express data-plane facts (appends, flushes,
acknowledgements, page-cache loss), so failures are replay JSON, not scenario YAML.

This module owns the runs, the shrinking and the summary. It must not model the cluster
(`faults_sim`) nor define the schedule format (`faults_schedule`), and it never reads the
clock except to report how fast the runs went.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from simulation.faults_schedule import (
    LIFECYCLE_OPS,
    Mode,
    Schedule,
    dump_replay,
    generate,
    schedule_seed,
)
from simulation.faults_sim import FaultSim
from simulation.faults_verdict import Outcome

__all__ = [
    "Failure",
    "FaultsSummary",
    "Mode",
    "Outcome",
    "Schedule",
    "generate",
    "replay",
    "run_faults",
    "run_schedule",
    "shrink",
]


MAX_LISTED = 20  # failing schedules listed in a summary (all are counted)


def run_schedule(schedule: Schedule, mode: Mode) -> Outcome:
    return FaultSim(schedule, mode).run()


class Failure(msgspec.Struct, kw_only=True):
    index: int
    seed: int
    lost_silent: int
    violations: list[str]
    examples: list[str]
    faults_before: int
    faults_after: int | None = None  # after shrinking
    ops_before: int = 0  # lifecycle ops
    ops_after: int | None = None
    file: str | None = None

    @classmethod
    def of(cls, index: int, schedule: Schedule, out: Outcome) -> Failure:
        return cls(
            index=index,
            seed=schedule.seed,
            lost_silent=out.lost_silent,
            violations=out.violations[:5],
            examples=out.silent_examples[:3],
            faults_before=len(schedule.faults),
            ops_before=len(schedule.ops),
        )


class FaultsSummary(msgspec.Struct, kw_only=True):
    mode: str
    seed: int
    schedules: int = 0
    acknowledged: int = 0
    present: int = 0
    lost_reported: int = 0
    lost_silent: int = 0
    lost_classic: int = 0  # ELR modes: lost under a feature cycle's classic window
    unreadable: int = 0
    deleted: int = 0
    unavailable_partition_seconds: float = 0.0
    unclean_recoveries: int = 0
    operator_elections: int = 0
    invariant_violations: int = 0
    failing_schedules: int = 0
    failovers: int = 0
    aborted_transactions: int = 0
    lifecycle: dict[str, int] = {}
    failures: list[Failure] = []
    elapsed_s: float = 0.0

    def add(self, out: Outcome) -> None:
        self.schedules += 1
        self.acknowledged += out.acknowledged
        self.present += out.present
        self.lost_reported += out.lost_reported
        self.lost_silent += out.lost_silent
        self.lost_classic += out.lost_classic
        self.unreadable += out.unreadable
        self.deleted += out.deleted
        for what, n in out.lifecycle.items():
            self.lifecycle[what] = self.lifecycle.get(what, 0) + n
        self.unavailable_partition_seconds += out.unavailable_partition_ms / 1000
        self.unclean_recoveries += out.unclean_recoveries
        self.operator_elections += out.operator_elections
        self.invariant_violations += len(out.violations)
        self.failing_schedules += out.failed
        self.failovers += out.failovers
        self.aborted_transactions += out.aborted_transactions

    @property
    def schedules_per_s(self) -> float:
        return self.schedules / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = msgspec.to_builtins(self)
        doc["lifecycle"] = dict(sorted(self.lifecycle.items()))
        doc["unavailable_partition_seconds"] = round(self.unavailable_partition_seconds, 3)
        doc["elapsed_s"] = round(self.elapsed_s, 3)
        doc["schedules_per_s"] = round(self.schedules_per_s, 1)
        return doc

    def lines(self) -> list[str]:
        out = [
            f"mode: {self.mode}",
            f"schedules: {self.schedules} (seed {self.seed}), "
            f"{self.schedules_per_s:.1f} schedules/s",
            f"acknowledged: {self.acknowledged} records",
            f"  present: {self.present}",
            f"  lost, reported: {self.lost_reported}",
            f"  lost silently: {self.lost_silent}",
        ]
        if self.lost_classic:
            out.append(
                f"  lost under the classic rules (a downgrade's window): {self.lost_classic}"
            )
        if self.unreadable:
            out.append(f"  unreadable (no leader at the end): {self.unreadable}")
        if self.deleted:
            out.append(f"  of topics deleted since (not checked): {self.deleted}")
        out += [
            f"unavailable partition-seconds: {self.unavailable_partition_seconds:.1f}",
            f"unclean recoveries: {self.unclean_recoveries}"
            f" (operator elections: {self.operator_elections})",
            f"invariant violations: {self.invariant_violations}",
        ]
        if self.failovers:
            out.append(
                f"controller failovers: {self.failovers} (open transactions aborted by the "
                f"new controller: {self.aborted_transactions})"
            )
        if self.lifecycle:
            ops = ", ".join(f"{what} {n}" for what, n in sorted(self.lifecycle.items()))
            out.append(f"lifecycle: {ops}")
        for f in self.failures:
            what = f"schedule {f.index} (seed {f.seed}): {f.lost_silent} lost silently"
            if f.violations:
                what += f", {len(f.violations)} invariant violations"
            if f.faults_after is not None:
                what += (
                    f"; shrunk from {f.faults_before} to {f.faults_after} faults, "
                    f"{f.ops_before} to {f.ops_after} lifecycle ops"
                )
            if f.file:
                what += f"; replay: metactl simulate faults --replay {f.file}"
            out.append(what)
            out.extend(f"    {e}" for e in (f.examples + f.violations)[:3])
        return out


def shrink(
    schedule: Schedule, mode: Mode, fails: Callable[[Outcome], bool] | None = None
) -> Schedule:
    """A smaller schedule that still fails: drop faults and lifecycle ops one at a time
    (restarting after every success, simple delta debugging), then try a lossless, fast
    network."""
    check = fails or (lambda out: out.failed)
    current = schedule
    progress = True
    while progress:
        progress = False
        candidates = [
            msgspec.structs.replace(current, faults=current.faults[:i] + current.faults[i + 1 :])
            for i in range(len(current.faults))
        ] + [
            msgspec.structs.replace(current, ops=current.ops[:i] + current.ops[i + 1 :])
            for i in range(len(current.ops))
        ]
        for candidate in candidates:
            if check(run_schedule(candidate, mode)):
                current, progress = candidate, True
                break
    for quieter in (
        msgspec.structs.replace(current, drop=0.0),
        msgspec.structs.replace(current, drop=0.0, max_delay_ms=5),
    ):
        if quieter != current and check(run_schedule(quieter, mode)):
            current = quieter
    return current


def run_faults(
    *,
    schedules: int,
    seed: int,
    mode: Mode,
    lossy_kills: int = 2,
    lifecycle_ops: int = LIFECYCLE_OPS,
    failovers: int = 0,
    save_dir: Path | None = None,
    shrink_max: int = 3,
    progress: Callable[[FaultsSummary], None] | None = None,
) -> FaultsSummary:
    """Run `schedules` seeded schedules; shrink and save (to `save_dir`) up to
    `shrink_max` failing ones; list the first `MAX_LISTED`. `progress` hears the summary
    so far after every schedule (`summary.schedules` of `schedules` done)."""
    summary = FaultsSummary(mode=mode.label, seed=seed)
    started = time.perf_counter()  # only to report schedules/s
    for i in range(schedules):
        sched = generate(schedule_seed(seed, i), lossy_kills, lifecycle_ops, failovers)
        out = run_schedule(sched, mode)
        summary.add(out)
        if out.failed and len(summary.failures) < MAX_LISTED:
            fail = Failure.of(i, sched, out)
            if save_dir is not None and len(summary.failures) < shrink_max:
                small = shrink(sched, mode)
                fail.faults_after = len(small.faults)
                fail.ops_after = len(small.ops)
                save_dir.mkdir(parents=True, exist_ok=True)
                path = save_dir / f"faults-seed{seed}-schedule{i}.json"
                found = msgspec.to_builtins(run_schedule(small, mode))
                dump_replay(path, mode, small, found)
                fail.file = str(path)
            summary.failures.append(fail)
        if progress is not None:
            summary.elapsed_s = time.perf_counter() - started
            progress(summary)
    summary.elapsed_s = time.perf_counter() - started
    return summary


def replay(schedule: Schedule, mode: Mode) -> FaultsSummary:
    """One schedule from a replay file, summarised like a run of one."""
    summary = FaultsSummary(mode=mode.label, seed=schedule.seed)
    started = time.perf_counter()
    out = run_schedule(schedule, mode)
    summary.add(out)
    if out.failed:
        summary.failures.append(Failure.of(0, schedule, out))
    summary.elapsed_s = time.perf_counter() - started
    return summary
