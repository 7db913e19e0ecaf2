"""The report of a chaos run: one JSON document (the `--json` object and `--report`
file) and its text table.

`build_report` reads a finished, failed or interrupted run (a `chaos.runner.ChaosRun`,
seen through the `Run` interface: this module imports no runner): without the final
results (interrupted, or an error before the check) the checker's fields are None and
the verdict says so. Keys always present: `faults`, `acknowledged`, `lost_reported`,
`lost_silent`, `unavailable_partition_seconds`, `unclean_recoveries`,
`potential_data_loss_metric`, `acked_records_per_s`, `verdict` (see docs/chaos.md).

Pure formatting: no processes, no network.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Protocol

from chaos.check import (
    TOPIC,
    Ack,
    Recovery,
    ValueAck,
    Verdict,
    classify,
    content_inputs,
    leaderless_seconds,
    recoveries_of,
)
from chaos.config import ChaosConfig
from chaos.faults import Faults
from chaos.plan import CONTROLLER_OPS, ETCD_OPS
from chaos.processes import Processes
from chaos.watch import Watch


class Run(Protocol):
    """What the report reads of a run."""

    cfg: ChaosConfig
    root: Path
    acked_path: Path
    procs: Processes
    faults: Faults
    watch: Watch
    acks: list[tuple[int, int, int, int]]  # partition, base, count, epoch
    bounds: list[int | None]
    ack_values: list[bytes]  # with librdkafka: each ack's value
    refused: Counter[str]
    sampled_ms: float
    phase: str
    interrupted: bool
    produce_s: float
    results: dict[str, Any]


def verdict(run: Run, recoveries: list[Recovery]) -> Verdict:
    if run.cfg.client == "librdkafka":  # by content: the value at the acknowledged offset
        values = [
            ValueAck(a[0], a[1], v, b)
            for a, v, b in zip(run.acks, run.ack_values, run.bounds, strict=True)
        ]
        acks, committed = content_inputs(values, run.results["kafka_logs"])
        return classify(acks, committed, recoveries)
    acks = [Ack(*a, bound=b) for a, b in zip(run.acks, run.bounds, strict=True)]
    return classify(acks, run.results["committed"], recoveries)


def build_report(run: Run) -> dict[str, Any]:
    cfg = run.cfg
    acknowledged = sum(a[2] for a in run.acks)
    fault_log = run.faults.log
    counts = Counter(f["kind"] for f in fault_log)
    doc: dict[str, Any] = {
        "config": {
            "brokers": cfg.brokers,
            "partitions": cfg.partitions,
            "rf": cfg.rf,
            "min_isr": cfg.min_isr,
            "strategy": cfg.strategy,
            "mode": cfg.mode,
            "lossy_kills_bound": cfg.lossy_kills,
            "duration_s": cfg.duration_s,
            "seed": cfg.seed,
            "schedule": "random" if cfg.schedule is None else "given",
            "controllers": cfg.controllers,
            "etcd": cfg.etcd,
            "base_port": cfg.base_port,
            "client": cfg.client,
        },
        "client": cfg.client,
        "data_dir": str(run.root),
        "acked_log": str(run.acked_path),
        "interrupted": run.interrupted,
        "phase": run.phase,
        "pids": list(run.procs.pids),
        "faults": len(fault_log),
        "fault_counts": dict(sorted(counts.items())),
        "fault_log": fault_log,
        "faults_skipped": run.faults.skipped,
        "controller_faults": sum(n for k, n in counts.items() if k in CONTROLLER_OPS),
        "etcd_faults": sum(n for k, n in counts.items() if k in ETCD_OPS),
        "fault_roles": dict(
            sorted(Counter(f"{f['kind']} {f['role']}" for f in fault_log if "role" in f).items())
        ),
        "restart_failures": list(run.faults.restart_failures),
        "unexpected_exits": list(run.faults.unexpected_exits),
        "lossy_kills": counts.get("kill_lossy", 0),
        "fault_phase_s": round(run.faults.phase_s, 2),
        "acknowledged": acknowledged,
        "acked_batches": len(run.acks),
        "acked_records_per_s": round(acknowledged / run.produce_s, 1) if run.produce_s else 0.0,
        "refused_batches": dict(sorted(run.refused.items())),
        "present": None,
        "lost_reported": None,
        "lost_silent": None,
        "unreadable": None,
        "unavailable_partition_seconds": None,
        "unavailable_sampled_seconds": round(run.sampled_ms / 1000, 1),
        "unclean_recoveries": None,
        "potential_data_loss_metric": None,
        "metric_scrape_failures": run.watch.metric_scrape_failures,
        "verdict": "interrupted" if run.interrupted else "incomplete",
    }
    if not run.results:
        return doc
    res = run.results
    recs = recoveries_of(res["records"], TOPIC)
    v = verdict(run, recs)
    start_ms = next(
        (f.timestamp_ms for f in res["records"] if getattr(f.record, "topic", None) == TOPIC),
        None,
    )
    final = res["final_metric"]
    doc.update(
        present=v.present,
        lost_reported=v.lost_reported,
        lost_silent=v.lost_silent,
        unreadable=v.unreadable,
        silent_examples=v.silent_examples,
        by_partition={str(k): dict(c) for k, c in sorted(v.by_partition.items())},
        read_errors={str(k): e for k, e in res["read_errors"].items()},
        unavailable_partition_seconds=round(
            leaderless_seconds(res["records"], TOPIC, res["end_ms"], start_ms), 1
        ),
        unclean_recoveries=sum(1 for r in recs if r.potential_data_loss),
        unclean_recovery_records=[vars(r) for r in recs],
        potential_data_loss_metric=None if final is None else int(final),
        potential_data_loss_by_term=[
            {"controller": name, "pid": pid, "failovers": term, "value": int(value)}
            for (name, pid, term), value in sorted(run.watch.term_metric.items())
        ],
        metadata_snapshot_at=res["snapshot_at"],
    )
    if cfg.client == "librdkafka":
        truncations = res["consumer_truncations"]
        doc.update(
            consumer_truncations=sum(truncations.values()),
            consumer_truncations_by_partition={str(k): n for k, n in truncations.items()},
            consumer_offset_resets=sum(res["consumer_offset_resets"].values()),
            consumer_errors=res["consumer_errors"],
            truncation_examples=res["truncation_examples"],
            producer_restarts=res["producer_restarts"],
            follower_caught_up=res["follower_caught_up"],
        )
    doc["metric_matches_log"] = doc["potential_data_loss_metric"] == doc["unclean_recoveries"]
    # A potential data-loss event the metric did not count (or one counted twice) is a
    # broken report too; a metric that could not be read at all is only unknown.
    doc["metric_mismatch"] = (
        doc["potential_data_loss_metric"] is not None and not doc["metric_matches_log"]
    )
    verdict_text = "SILENT LOSS" if v.lost_silent else "no silent loss"
    if doc["metric_mismatch"]:
        verdict_text += "; METRIC != LOG"
    doc["verdict"] = verdict_text
    return doc


# --- the report as text ---------------------------------------------------------------


def table(report: dict[str, Any]) -> str:
    rows: list[tuple[str, str]] = [
        ("mode", str(report["config"]["mode"])),
        ("client", str(report.get("client", "metactl"))),
        ("strategy", str(report["config"]["strategy"])),
        ("seed", str(report["config"]["seed"])),
        ("fault phase (s)", f"{report['fault_phase_s']:.1f}"),
        ("faults", f"{report['faults']}  {_kinds(report['fault_counts'])}"),
        (
            "on controllers / etcd",
            f"{report['controller_faults']} / {report['etcd_faults']}  "
            + ", ".join(f"{k} {v}" for k, v in report["fault_roles"].items()),
        ),
        ("lossy kills", str(report["lossy_kills"])),
        ("acknowledged records", str(report["acknowledged"])),
        ("acked records/s", f"{report['acked_records_per_s']:.1f}"),
        ("refused batches", _kinds(report["refused_batches"]) or "0"),
        ("present", _n(report.get("present"))),
        ("lost, reported", _n(report.get("lost_reported"))),
        ("LOST SILENTLY", _n(report.get("lost_silent"))),
        ("unreadable", _n(report.get("unreadable"))),
        ("unclean recoveries (log)", _n(report.get("unclean_recoveries"))),
        ("potential data loss (metric)", _n(report.get("potential_data_loss_metric"))),
        ("unavailable partition-s", _f(report.get("unavailable_partition_seconds"))),
        ("unavailable partition-s (sampled)", _f(report.get("unavailable_sampled_seconds"))),
        ("verdict", str(report["verdict"])),
    ]
    if report.get("client") == "librdkafka":
        rows.insert(
            -1,
            (
                "truncations seen (consumer)",
                f"{_n(report.get('consumer_truncations'))}  "
                f"offset resets {_n(report.get('consumer_offset_resets'))}",
            ),
        )
    cfg = report["config"]
    if cfg.get("controllers", 1) == 1 and not cfg.get("etcd"):
        rows = [r for r in rows if r[0] != "on controllers / etcd"]
    else:
        rows.insert(0, ("controllers / etcd members", f"{cfg['controllers']} / {cfg['etcd']}"))
    width = max(len(k) for k, _ in rows)
    lines = [f"metactl chaos run — {report['data_dir']}"]
    lines += [f"  {k:<{width}}  {v}" for k, v in rows]
    return "\n".join(lines)


def _kinds(counts: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(counts.items()))


def _n(x: Any) -> str:
    return "-" if x is None else str(int(x))


def _f(x: Any) -> str:
    return "-" if x is None else f"{float(x):.1f}"
