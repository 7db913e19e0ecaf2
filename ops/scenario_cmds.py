"""`metactl scenario run FILE.yaml [--json] [--data-dir D]`: print what the runner reports.

Exit status: 0 when every expectation holds, 1 when one fails, 2 for an invalid file;
other failures by the one table (docs/cli.md: 4 for a missing file, 130 for Ctrl-C).
Partition lines are `metactl describe`'s (ops.describe_cmds.partition_line). The
runner (the controller core, YAML) is imported when the command runs, not to build its
parser (issue 34).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ops.cli import EXIT_OK, EXIT_REFUSED, HELP_FORMAT, examples
from ops.describe_cmds import NO_LEADER, partition_line

if TYPE_CHECKING:
    from protocol.messages.admin import PartitionState
    from simulation.scenario_report import PartitionReport, StepReport, Summary


def register(sub: Any) -> None:
    scenario = sub.add_parser(
        "scenario",
        help="run what-if scenarios on the real controller core",
        description="Deterministic what-if scenarios: the real controller core on a real "
        "log, with virtual time and simulated brokers (docs/scenarios.md).",
        epilog=examples(
            "metactl scenario run simulation/scenarios/worked-5.3.3-balanced-recovery.yaml",
            "metactl scenario run my-case.yaml --json --data-dir /tmp/case",
        ),
        formatter_class=HELP_FORMAT,
    )
    scenario.set_defaults(help_parser=scenario)
    ssub = scenario.add_subparsers(dest="scenario_command", metavar="SUBCOMMAND")
    run = ssub.add_parser(
        "run",
        help="run a scenario file",
        description="Run a scenario file step by step, printing each step's state. Exit 0 "
        "when every expectation holds, 1 when one fails (with a diff), 2 when the file is "
        "invalid (naming the step and field).",
        epilog=examples(
            "metactl scenario run simulation/scenarios/worked-5.3.3-balanced-recovery.yaml",
            "metactl scenario run my-case.yaml --json | jq .events",
            "metactl scenario run my-case.yaml --data-dir /tmp/case && "
            "metactl events --data-dir /tmp/case",
        ),
        formatter_class=HELP_FORMAT,
    )
    run.add_argument("file", type=Path, help="the scenario, YAML (docs/scenarios.md)")
    run.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per step, then a summary (default: text)",
    )
    run.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep the metadata log here, for `metactl log`/`events`/`describe --data-dir` "
        "(default: a temporary directory, removed)",
    )
    run.set_defaults(func=cmd_run)


def _fmt(xs: list[int] | None) -> str:
    return "-" if xs is None else "[" + ",".join(map(str, xs)) + "]"


def report_state(name: str, p: PartitionReport) -> PartitionState:
    """A reported partition in the wire's shape, so it prints as `describe` prints it."""
    from metadata_image.state import parse_tp
    from protocol.messages.admin import PartitionState

    topic, partition = parse_tp(name)
    return PartitionState(
        topic=topic,
        partition=partition,
        replicas=p.replicas,
        leader=NO_LEADER if p.leader is None else p.leader,
        leader_epoch=p.leader_epoch,
        partition_epoch=p.partition_epoch,
        isr=p.isr,
        elr=p.elr,
        last_known_elr=p.last_known_elr,
        recovering=p.recovering,
        recovery_pending=p.recovery_pending,
        min_isr=p.min_isr,
        adding_replicas=p.adding,
        removing_replicas=p.removing,
    )


def _partition_line(name: str, p: PartitionReport) -> str:
    return partition_line(report_state(name, p))


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
                for c in sorted(e["candidates"], key=lambda c: c["broker"])  # by broker id
            )
            print(
                f"           ⚠ unclean recovery {e['partition']} ({e['strategy']}): chose "
                f"{e['chosen']} from [{cands}] — potential data loss"
            )
    if report.action not in ("expect", "expect_error"):
        for name, p in report.partitions.items():
            print(_partition_line(name, p))


def _json_step(report: StepReport) -> str:
    from msgspec import to_builtins

    out = to_builtins(report)
    if not out.get("failures"):
        out.pop("failures", None)
    if not out.get("detail"):
        out.pop("detail", None)
    return json.dumps(out, sort_keys=False)


def cmd_run(args: argparse.Namespace) -> int:
    import asyncio

    from simulation.scenario import run_scenario
    from simulation.scenario_format import load_scenario

    scenario = load_scenario(args.file)  # INVALID_SCENARIO: exit 2 (ops.cli.USAGE_CODES)

    def on_step(report: StepReport) -> None:
        if args.json:
            print(_json_step(report), flush=True)
        else:
            _print_human(report)

    _, summary = asyncio.run(run_scenario(scenario, args.data_dir, on_step))
    _print_summary(summary, args.json)
    return EXIT_OK if summary.failed_expectations == 0 else EXIT_REFUSED


def _print_summary(summary: Summary, as_json: bool) -> None:
    if as_json:
        from msgspec import to_builtins

        print(json.dumps({"summary": to_builtins(summary)}))
    else:
        verdict = "all expectations hold" if summary.failed_expectations == 0 else "FAILED"
        print(
            f"\n{summary.steps} steps, {summary.failed_expectations} failed, "
            f"log end offset {summary.log_end_offset}, "
            f"{summary.potential_data_loss_events} potential data-loss event(s): {verdict}"
        )
