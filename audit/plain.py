"""The single-process baseline: one plain pass over each log, no Spark.

Reads the SQLite log with the stdlib, decodes every batch with msgspec through
`metadata_log.records.decode_batch` (leaving out aborted transactions,
`audit.transactions`), and computes in plain Python what every audit job computes: the
same tables, handed to each job's own ``_result``, so that summaries, statistics and
reports come out exactly as the Spark jobs' do (the invariants with the same
`audit.log_checker.LogChecker`). The benchmark (`bench/spark_audit.py`) times it against Spark
on the same logs; tests use it as an independent implementation to cross-check the
Spark jobs' answers.

Like the Spark paths, the pass runs with the cyclic garbage collector paused
(`audit.rows.paused_gc`): decoding makes millions of objects without cycles, and
collections triggered by their count would double the time of the decode.

`run_jobs` computes any of the jobs (each job's own per-record work only: a job run
alone pays the decode and its own work), and the log's `audit.lifecycle.Lifecycle` (topic
generations, deletions, the final shutdown) that every job keys and classifies by. `run`
is the older entry point: recoveries and violations as plain values. The offline job's
measures are `audit.plain_offline`'s (the offline job's logs method runs them too); the
others' are here.

It must not change a log, nor summarize a job's tables itself (each job's ``_result``
does).
"""

from __future__ import annotations

import time
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd

from audit.invariant_rows import checker_rows, to_batch
from audit.lifecycle import Lifecycle, LifecycleTracker
from audit.log_checker import LogChecker
from audit.logread import cluster_name, log_info, log_time_bounds
from audit.plain_offline import OfflineMeasures
from audit.rows import paused_gc
from audit.rules import Violation
from audit.transactions import committed_batches
from metadata_log.records import (
    BrokerRegistrationChangeRecord,
    FenceBrokerRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    UncleanRecoveryRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
)

JOBS: Final = ("elections", "unclean-recoveries", "offline", "brokers", "invariants")
_UNIT_MS: Final = {"minute": 60_000, "hour": 3_600_000, "day": 86_400_000}


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


def _in(ts: int, since: int | None, until: int | None) -> bool:
    return (since is None or ts >= since) and (until is None or ts < until)


def _utc(ms: Any) -> Any:
    return pd.to_datetime(ms, unit="ms", utc=True)


# --- unclean-recoveries --------------------------------------------------------------------


class _Recoveries:
    def __init__(self, since: int | None, until: int | None, life: LifecycleTracker) -> None:
        self.since, self.until = since, until
        self.life = life
        self.rows: list[dict[str, Any]] = []
        self.went_offline: dict[tuple[str, str, str, int], int] = {}

    def feed(self, cluster: str, base: int, ts: int, records: Sequence[Any]) -> None:
        topic_id = self.life.topic_id_at
        for i, r in enumerate(records):
            if type(r) is PartitionChangeRecord:
                if r.leader == -1:
                    tid = topic_id(cluster, r.topic, base + i)
                    self.went_offline[(cluster, r.topic, tid, r.partition)] = ts
            elif type(r) is UncleanRecoveryRecord and _in(ts, self.since, self.until):
                kind, margin, runner = _margin(r)
                tid = topic_id(cluster, r.topic, base + i)
                start = self.went_offline.get((cluster, r.topic, tid, r.partition))
                won = next((c for c in r.candidates if c.broker_id == r.chosen), None)
                up = next((c for c in r.candidates if c.broker_id == runner), None)
                self.rows.append(
                    {
                        "cluster": cluster,
                        "offset": base + i,
                        "timestamp": ts,
                        "topic": r.topic,
                        "topic_id": tid,
                        "partition": r.partition,
                        "strategy": r.strategy,
                        "trigger": r.trigger,
                        "chosen": r.chosen,
                        "chosen_last_leader_epoch": None if won is None else won.last_leader_epoch,
                        "chosen_log_end_offset": None if won is None else won.log_end_offset,
                        "runner_up": runner,
                        "runner_up_last_leader_epoch": None if up is None else up.last_leader_epoch,
                        "runner_up_log_end_offset": None if up is None else up.log_end_offset,
                        "margin_kind": kind,
                        "margin": margin,
                        "candidates": [
                            {
                                "broker": c.broker_id,
                                "last_leader_epoch": c.last_leader_epoch,
                                "log_end_offset": c.log_end_offset,
                            }
                            for c in r.candidates
                        ],
                        "candidates_reported": len(r.candidates),
                        "potential_data_loss": r.potential_data_loss,
                        "offline_start": start,
                        "time_to_recovery_ms": None if start is None else ts - start,
                        "offline_since": r.offline_since_ms,
                    }
                )

    def table(self) -> pd.DataFrame:
        from audit.jobs.unclean import OUTPUT_COLUMNS

        df = pd.DataFrame.from_records(self.rows, columns=list(OUTPUT_COLUMNS))
        for col in ("timestamp", "offline_start", "offline_since"):
            df[col] = _utc(df[col])
        return df.sort_values(["cluster", "offset"]).reset_index(drop=True)


# --- elections -----------------------------------------------------------------------------


class _Elections:
    def __init__(self, since: int | None, until: int | None, life: LifecycleTracker) -> None:
        self.since, self.until = since, until
        self.life = life
        # (cluster, topic, topic id, kind) -> the elections' times
        self.stamps: dict[tuple[str, str, str, str], array[int]] = {}
        # (cluster, topic, topic id, partition) -> [leader, its offset, replicas, their offset]
        self.final: dict[tuple[str, str, str, int], list[Any]] = {}

    def feed(self, cluster: str, base: int, ts: int, records: Sequence[Any]) -> None:
        for i, r in enumerate(records):
            kind = type(r)
            if kind is PartitionChangeRecord:
                if r.leader is None and r.replicas is None:
                    continue
                tid = self.life.topic_id_at(cluster, r.topic, base + i)
                if r.election is not None and _in(ts, self.since, self.until):
                    key = (cluster, r.topic, tid, str(r.election))
                    got = self.stamps.get(key)
                    if got is None:
                        got = self.stamps[key] = array("q")
                    got.append(ts)
            elif kind is PartitionRecord:
                tid = self.life.topic_id_at(cluster, r.topic, base + i)
            else:
                continue
            state = self.final.get((cluster, r.topic, tid, r.partition))
            if state is None:
                state = self.final[(cluster, r.topic, tid, r.partition)] = [None] * 4
            if r.leader is not None:
                state[0], state[1] = r.leader, base + i
            if r.replicas is not None:
                state[2], state[3] = list(r.replicas), base + i

    def tables(self, bucket: str | None, life: Lifecycle) -> tuple[str, pd.DataFrame, pd.DataFrame]:
        from audit.jobs.elections import _final, pick_bucket

        everything = [np.frombuffer(a, dtype=np.int64) for a in self.stamps.values() if len(a)]
        lo = min((int(a.min()) for a in everything), default=None)
        hi = max((int(a.max()) for a in everything), default=None)
        unit = bucket or pick_bucket(0 if lo is None or hi is None else hi - lo)
        step = _UNIT_MS[unit]
        rows: list[tuple[str, str, str, str, int, int]] = []
        for (cluster, topic, tid, kind), got in self.stamps.items():
            stamps = np.frombuffer(got, dtype=np.int64)
            buckets, counts = np.unique(stamps - stamps % step, return_counts=True)
            rows.extend(
                (cluster, topic, tid, kind, int(b), int(c))
                for b, c in zip(buckets.tolist(), counts.tolist(), strict=True)
            )
        by_bucket = pd.DataFrame.from_records(
            rows, columns=["cluster", "topic", "topic_id", "election_kind", "bucket", "elections"]
        )
        by_bucket["bucket"] = _utc(by_bucket["bucket"])
        by_bucket = by_bucket.sort_values(
            ["bucket", "cluster", "topic", "topic_id", "election_kind"]
        )
        final_rows = [
            (cluster, topic, tid, part, leader, leader_at, replicas)
            for (cluster, topic, tid, part), (leader, leader_at, replicas, _) in self.final.items()
            if replicas is not None
        ]
        final = pd.DataFrame.from_records(
            final_rows,
            columns=[
                "cluster",
                "topic",
                "topic_id",
                "partition",
                "leader",
                "leader_offset",
                "replicas",
            ],
        )
        return unit, by_bucket.reset_index(drop=True), _final(final, life)


# --- brokers -------------------------------------------------------------------------------


def _brc_reason(r: BrokerRegistrationChangeRecord) -> str | None:
    if r.in_controlled_shutdown:
        return "controlled_shutdown"
    if r.fenced is not None:
        return "fenced" if r.fenced else "unfenced"
    return None


class _Brokers:
    _COUNTS = (
        "fences",
        "unfences",
        "registrations",
        "unclean_registrations",
        "controlled_shutdowns",
        "session_timeouts",
        "unregistrations",
    )

    def __init__(self, since: int | None, until: int | None) -> None:
        self.since, self.until = since, until
        self.counts: dict[tuple[str, int], dict[str, Any]] = {}
        self.fence_times: dict[tuple[str, int], list[int]] = {}
        self.reasons: dict[str, int] = {}

    def _broker(self, key: tuple[str, int]) -> dict[str, Any]:
        c = self.counts.get(key)
        if c is None:
            c = self.counts[key] = dict.fromkeys(self._COUNTS, 0)
            c["first_registration"] = c["last_fence"] = None
        return c

    def _fence(self, key: tuple[str, int], c: dict[str, Any], ts: int, reason: str) -> None:
        c["fences"] += 1
        c["last_fence"] = ts if c["last_fence"] is None else max(c["last_fence"], ts)
        self.fence_times.setdefault(key, []).append(ts)
        self.reasons[reason] = self.reasons.get(reason, 0) + 1

    def feed(self, cluster: str, base: int, ts: int, records: Sequence[Any]) -> None:
        del base
        if not _in(ts, self.since, self.until):
            return
        for r in records:
            kind = type(r)
            if kind is PartitionChangeRecord:
                continue
            if kind is FenceBrokerRecord:
                key = (cluster, r.broker_id)
                c = self._broker(key)
                self._fence(key, c, ts, r.reason)
                if r.reason == "session_timeout":
                    c["session_timeouts"] += 1
            elif kind is UnfenceBrokerRecord:
                self._broker((cluster, r.broker_id))["unfences"] += 1
            elif kind is RegisterBrokerRecord:
                c = self._broker((cluster, r.broker_id))
                c["registrations"] += 1
                if not r.clean:
                    c["unclean_registrations"] += 1
                first = c["first_registration"]
                c["first_registration"] = ts if first is None else min(first, ts)
            elif kind is BrokerRegistrationChangeRecord:
                key = (cluster, r.broker_id)
                c = self._broker(key)
                reason = _brc_reason(r)
                if reason == "fenced":
                    self._fence(key, c, ts, reason)
                elif reason == "unfenced":
                    c["unfences"] += 1
                elif reason == "controlled_shutdown":
                    c["controlled_shutdowns"] += 1
            elif kind is UnregisterBrokerRecord:
                self._broker((cluster, r.broker_id))["unregistrations"] += 1

    def tables(self, window_ms: int) -> tuple[pd.DataFrame, pd.DataFrame]:
        rows = []
        for key in sorted(self.counts):
            c = self.counts[key]
            worst, worst_end = 0, None
            times = sorted(self.fence_times.get(key, []))
            for t in times:
                # Fences in [t - window + 1, t], those at t itself included (a range frame).
                n = bisect_left(times, t + 1) - bisect_left(times, t - window_ms + 1)
                if n > worst:
                    worst, worst_end = n, t
            rows.append(
                {
                    "cluster": key[0],
                    "broker": key[1],
                    **{k: c[k] for k in self._COUNTS},
                    "first_registration": c["first_registration"],
                    "last_fence": c["last_fence"],
                    "max_fences_in_window": worst,
                    "worst_window_end_ms": worst_end,
                }
            )
        table = pd.DataFrame.from_records(
            rows,
            columns=[
                "cluster",
                "broker",
                *self._COUNTS,
                "first_registration",
                "last_fence",
                "max_fences_in_window",
                "worst_window_end_ms",
            ],
        )
        for col in ("first_registration", "last_fence"):
            table[col] = _utc(table[col])
        reasons = pd.DataFrame(
            sorted(self.reasons.items(), key=lambda kv: -kv[1]), columns=["reason", "count"]
        )
        return table, reasons


# --- the pass ------------------------------------------------------------------------------


@dataclass
class PlainRun:
    """What `run_jobs` returns: each job's result, and what the pass read."""

    results: dict[str, Any]
    records: int
    seconds: float


def run_jobs(
    data_dirs: Sequence[str | Path],
    jobs: Iterable[str] = JOBS,
    *,
    clusters: Sequence[str] = (),
    since_ms: int | None = None,
    until_ms: int | None = None,
    bucket: str | None = None,
    flap_fences: int = 3,
    flap_window_ms: int = 600_000,
    show: int = 20,
    top: int = 20,
) -> PlainRun:
    """The audits of `jobs` over the logs in `data_dirs`, in one plain pass each, as the
    Spark jobs' `JobResult` (same tables, summaries and statistics)."""
    from audit.jobs import brokers, elections, invariants, offline, unclean
    from audit.source import resolve_sources
    from audit.spark import AuditInput

    wanted = list(dict.fromkeys(jobs))
    unknown = [j for j in wanted if j not in JOBS]
    if unknown:
        raise ValueError(f"unknown job(s) {unknown}; known: {', '.join(JOBS)}")
    started = time.perf_counter()
    sources = resolve_sources([str(d) for d in data_dirs], list(clusters))
    inp = AuditInput.of(
        [str(d) for d in data_dirs],
        clusters=tuple(clusters),
        since_ms=since_ms,
        until_ms=until_ms,
    )
    life = LifecycleTracker()
    rec = _Recoveries(since_ms, until_ms, life) if "unclean-recoveries" in wanted else None
    ele = _Elections(since_ms, until_ms, life) if "elections" in wanted else None
    off = OfflineMeasures(since_ms, until_ms) if "offline" in wanted else None
    bro = _Brokers(since_ms, until_ms) if "brokers" in wanted else None
    checks: list[LogChecker] = []
    n = 0
    with paused_gc():
        for src in sources:
            info = log_info(src.path)
            if off is not None:
                newest = log_time_bounds(info.path)[1]
                if newest is not None:
                    off.ends[src.cluster] = newest if until_ms is None else min(newest, until_ms)
            lc = LogChecker(src.cluster) if "invariants" in wanted else None
            if lc is not None:
                checks.append(lc)
            feeders = [life.feed_batch] + [a.feed for a in (rec, ele, off, bro) if a is not None]
            stored = committed_batches(info.path, info.start_offset, info.end_offset, until_ms)
            for base, ts, records in stored:
                n += len(records)
                if lc is not None:
                    lc.feed(base, ts, records)
                for feed in feeders:
                    feed(src.cluster, base, ts, records)
    results: dict[str, Any] = {}
    lived = life.result()
    for job in wanted:
        if job == "unclean-recoveries" and rec is not None:
            results[job] = unclean._result(inp, rec.table(), show, lived)
        elif job == "elections" and ele is not None:
            unit, by_bucket, final = ele.tables(bucket, lived)
            results[job] = elections._result(inp, unit, by_bucket, final, lived)
        elif job == "offline" and off is not None:
            results[job] = offline._result(inp, off.table(), top, lived)
        elif job == "brokers" and bro is not None:
            table, reasons = bro.tables(flap_window_ms)
            table["flapping"] = table["max_fences_in_window"] > flap_fences
            results[job] = brokers._result(inp, table, reasons, flap_fences, flap_window_ms)
        elif job == "invariants":
            out: list[tuple[Any, ...]] = []
            for lc in checks:
                for c in lc.finish():
                    checker_rows(c, out)
            rows = to_batch(out).to_pandas()
            results[job] = invariants._result(inp, rows, show, lived)
    return PlainRun(results, n, time.perf_counter() - started)


def run(
    data_dir: str | Path,
    *,
    recoveries: bool = True,
    invariants: bool = True,
    cluster: str | None = None,
) -> PlainResult:
    """One pass over the log computing the recoveries and the violations (plain values)."""
    started = time.perf_counter()
    info = log_info(data_dir)
    name = cluster if cluster is not None else cluster_name(data_dir)
    out = PlainResult()
    life = LifecycleTracker()
    acc = _Recoveries(None, None, life)
    checker = LogChecker(name)
    n = 0
    with paused_gc():
        for base, ts, records in committed_batches(info.path, info.start_offset, info.end_offset):
            n += len(records)
            if invariants:
                checker.feed(base, ts, records)
            if recoveries:
                life.feed_batch(name, base, ts, records)
                acc.feed(name, base, ts, records)
    out.recoveries = [
        {
            k: r[k]
            for k in (
                "cluster",
                "offset",
                "topic",
                "partition",
                "strategy",
                "trigger",
                "chosen",
                "runner_up",
                "margin_kind",
                "margin",
                "time_to_recovery_ms",
            )
        }
        for r in acc.rows
    ]
    for c in checker.finish():
        out.violations.extend(c.out)
        out.checked += c.records
    out.partitions = len(checker.checkers)
    out.records = n
    out.seconds = time.perf_counter() - started
    return out
