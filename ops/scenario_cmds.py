"""`metactl scenario run FILE.yaml [--json] [--data-dir D]`: print what the runner reports.

Exit status: 0 when every expectation holds, 1 when one fails, 2 for an invalid file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from metactl.errors import MetactlError, ScenarioError
from simulation.scenario import run_scenario
from simulation.scenario_format import load_scenario
from simulation.scenario_report import PartitionReport, StepReport, Summary


def register(sub: Any) -> None:
    scenario = sub.add_parser("scenario", help="run what-if scenarios on the real controller core")
    ssub = scenario.add_subparsers(dest="scenario_command", metavar="SUBCOMMAND")
    run = ssub.add_parser("run", help="run a scenario file")
    run.add_argument("file", type=Path)
    run.add_argument("--json", action="store_true", help="one JSON object per step")
    run.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="keep the metadata log here (default: a temp dir)",
    )
    run.set_defaults(func=cmd_run)


def _fmt(xs: list[int] | None) -> str:
    return "-" if xs is None else "[" + ",".join(map(str, xs)) + "]"


def _partition_line(name: str, p: PartitionReport) -> str:
    leader = "none" if p.leader is None else str(p.leader)
    state = "recovering" if p.recovering else "ok"
    if p.recovery_pending is not None:
        state = f"recovery_pending(awaiting {_fmt(p.recovery_pending)})"
    return (
        f"    {name:<16} Leader: {leader:<5} LeaderEpoch: {p.leader_epoch:<3} "
        f"Replicas: {_fmt(p.replicas):<10} Isr: {_fmt(p.isr):<10} Elr: {_fmt(p.elr):<8} "
        f"LastKnownElr: {_fmt(p.last_known_elr):<8} MinIsr: {p.min_isr} {state}"
    )


def _print_human(report: StepReport) -> None:
    status = "ok" if report.ok else ("FAILED" if report.failures else f"error {report.error}")
    if report.error and not report.failures:
        status = f"error {report.error} (expected)"
    detail = f"  {report.detail}" if report.detail else ""
    print(f"step {report.step:>3}  {report.action:<20} {status}{detail}")
    for f in report.failures:
        print(f"           ✗ {f}")
    for e in report.events:
        if e["type"] == "election":
            print(f"           → election {e['partition']}: leader {e['leader']} ({e['kind']})")
        else:
            cands = ", ".join(
                f"{c['broker']}@(epoch {c['last_leader_epoch']}, leo {c['log_end_offset']})"
                for c in e["candidates"]
            )
            print(
                f"           ⚠ unclean recovery {e['partition']} ({e['strategy']}): chose "
                f"{e['chosen']} from [{cands}] — potential data loss"
            )
    if report.action not in ("expect", "expect_error"):
        for name, p in report.partitions.items():
            print(_partition_line(name, p))


def _json_step(report: StepReport) -> str:
    out = msgspec.to_builtins(report)
    if not out.get("failures"):
        out.pop("failures", None)
    if not out.get("detail"):
        out.pop("detail", None)
    return json.dumps(out, sort_keys=False)


def cmd_run(args: argparse.Namespace) -> int:
    try:
        scenario = load_scenario(args.file)
    except (ScenarioError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    def on_step(report: StepReport) -> None:
        if args.json:
            print(_json_step(report), flush=True)
        else:
            _print_human(report)

    try:
        _, summary = asyncio.run(run_scenario(scenario, args.data_dir, on_step))
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except MetactlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    _print_summary(summary, args.json)
    return 0 if summary.failed_expectations == 0 else 1


def _print_summary(summary: Summary, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"summary": msgspec.to_builtins(summary)}))
    else:
        verdict = "all expectations hold" if summary.failed_expectations == 0 else "FAILED"
        print(
            f"\n{summary.steps} steps, {summary.failed_expectations} failed, "
            f"log end offset {summary.log_end_offset}, "
            f"{summary.potential_data_loss_events} potential data-loss event(s): {verdict}"
        )
