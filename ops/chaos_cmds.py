"""`metactl chaos run`: the command line of the chaos runner (`chaos.runner`).

Parses and checks the flags (a bad one is a named error and exit 2, no traceback), runs
the chaos run under asyncio with SIGINT turned into a cancellation (every process is
stopped and a partial report printed, exit 130), prints the table or, with `--json`,
ends stdout with exactly one JSON object, and writes `--report FILE`.

Exit status: 0 no silent loss (with `--expect-silent-loss`: 0 iff some silent loss was
found); 3 a silent loss (or, with `--expect-silent-loss`, none), or a data-loss metric
summed over the controllers' terms that differs from the log; 1 an error during the
run (after its partial report); 2 bad flags; 130 interrupted (docs/chaos.md); a failure
before the run starts has docs/cli.md's status. The first line on stdout is always
`STARTED {json}` once the cluster is up (data dir, controller address, pids).

Only the CLI lives here: nothing of the run itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

from metactl.errors import InvalidConfigurationError, InvalidRequestError, MetactlError
from metactl.numbers import decimal_arg, int_arg, long_arg
from ops.cli import EXIT_INTERRUPTED, EXIT_OK, EXIT_REFUSED, HELP_FORMAT, error_line, examples
from ops.run_progress import MODES

EXIT_SILENT_LOSS: Final = 3  # the command's own verdict (docs/cli.md)


def register(sub: Any) -> None:
    from controller.runtime.serve import add_rule_mode_arguments

    c = sub.add_parser(
        "chaos",
        help="fault injection with real processes",
        description="Fault injection with real processes (docs/chaos.md).",
        epilog=examples("metactl chaos run --duration 30 --seed 1"),
        formatter_class=HELP_FORMAT,
    )
    c.set_defaults(help_parser=c)
    csub = c.add_subparsers(dest="chaos_command", metavar="SUBCOMMAND")
    r = csub.add_parser(
        "run",
        help="start a cluster, produce with acks=all, inject faults, check every ack",
        description="Start a controller and brokers, produce with acks=all, inject a seeded "
        "fault plan (SIGKILL with and without page-cache loss, SIGTERM, SIGSTOP pauses, "
        "controller kills; with --etcd, kills and pauses of controllers and etcd members), "
        "heal, and classify every acknowledged record: present, lost "
        "and reported (an unclean recovery after its acknowledgement), or lost silently. "
        "See docs/chaos.md.",
        epilog=examples(
            "metactl chaos run --duration 30 --seed 1",
            "metactl chaos run --schedule builtin:outage --flush-interval-ms 5000 --json",
            "metactl chaos run --eligible-leader-replicas disabled --expect-silent-loss",
            "metactl chaos run --controllers 3 --etcd 3 --duration 600 --base-port 29100",
            "metactl chaos run --client librdkafka --duration 60 --seed 1",
        ),
        formatter_class=HELP_FORMAT,
    )
    r.add_argument("--brokers", type=int_arg, default=5, help="broker processes (default 5)")
    r.add_argument(
        "--controllers",
        type=int_arg,
        default=1,
        help="controller processes on one etcd metadata log (needs --etcd; default 1)",
    )
    r.add_argument(
        "--etcd",
        type=int_arg,
        default=0,
        metavar="M",
        help="run the metadata log on a local M-member etcd cluster (docs/ha.md); faults "
        "then include kills and pauses of the active controller, of standbys, of the etcd "
        "leader and of followers (default 0: one controller on SQLite)",
    )
    r.add_argument(
        "--lease-ttl-s",
        type=int_arg,
        default=2,
        help="the controllers' leadership lease on an etcd log (default 2)",
    )
    r.add_argument(
        "--base-port",
        type=int_arg,
        default=None,
        metavar="P",
        help="pin every port from P on: 2 per controller (listener, /metrics), 2 per etcd "
        "member (client, peer), 1 per broker, then with --client librdkafka 1 per broker "
        "(its Kafka listener) (default: free ports)",
    )
    r.add_argument(
        "--partitions", type=int_arg, default=6, help="partitions of the topic (default 6)"
    )
    r.add_argument("--rf", type=int_arg, default=3, help="replication factor (default 3)")
    r.add_argument("--min-isr", type=int_arg, default=2, help="min.insync.replicas (default 2)")
    r.add_argument(
        "--strategy",
        choices=["balanced", "proactive", "manual"],
        default="balanced",
        help="unclean recovery strategy (default balanced)",
    )
    add_rule_mode_arguments(r)
    r.add_argument(
        "--lossy-kills",
        type=int_arg,
        default=4,
        help="at most K lossy kills (random plans; default 4)",
    )
    r.add_argument(
        "--duration", type=decimal_arg, default=60.0, help="fault phase, seconds (default 60)"
    )
    r.add_argument("--seed", type=long_arg, default=0, help="random seed (default 0)")
    r.add_argument(
        "--schedule",
        default=None,
        metavar="FILE|builtin:NAME",
        help="a fault schedule (JSON) instead of a random plan; builtin:outage, "
        "builtin:controller-and-outage",
    )
    r.add_argument(
        "--client",
        choices=["metactl", "librdkafka"],
        default="metactl",
        help="who produces: metactl's own producer (default), or librdkafka (confluent-kafka) "
        "through the brokers' Kafka listeners, acks=all with idempotence, a librdkafka "
        "consumer counting the log truncations it detects, the read-back by Kafka Fetch",
    )
    r.add_argument("--producers", type=int_arg, default=3, help="producer groups (default 3)")
    r.add_argument("--batch", type=int_arg, default=50, help="records per batch (default 50)")
    r.add_argument(
        "--flush-interval-ms", type=long_arg, default=500, help="brokers' flush.ms (default 500)"
    )
    r.add_argument(
        "--session-timeout-ms",
        type=long_arg,
        default=1500,
        help="the controller's broker session timeout (default 1500)",
    )
    r.add_argument(
        "--heartbeat-interval-ms",
        type=long_arg,
        default=200,
        help="the brokers' heartbeat interval (default 200)",
    )
    r.add_argument(
        "--operator-elect",
        action="store_true",
        help="with --strategy manual: at heal, elect what an operator would (first live "
        "LastKnownELR member, else first live replica) instead of reporting unavailable",
    )
    r.add_argument("--data-dir", type=Path, default=None, help="default: a new temp dir")
    r.add_argument("--json", action="store_true", help="end stdout with one JSON object")
    r.add_argument(
        "--progress",
        choices=MODES,
        default="auto",
        help="progress on stderr: a bar (with the run's events above it) on a terminal, "
        "the events and a status line every few seconds otherwise (auto, the default), "
        "or off",
    )
    r.add_argument("--report", type=Path, default=None, help="write the JSON report here")
    r.add_argument(
        "--expect-silent-loss",
        action="store_true",
        help="exit 0 iff silent losses were found (classic mode)",
    )
    r.set_defaults(func=cmd_chaos_run)


def cmd_chaos_run(args: argparse.Namespace) -> int:
    from chaos.config import ChaosConfig
    from chaos.plan import check_brokers, load_schedule
    from chaos.processes import Timing
    from chaos.report import build_report, table
    from chaos.runner import ChaosRun
    from controller.runtime.serve import rule_mode
    from ops.run_progress import Progress

    for name in ("flush_interval_ms", "session_timeout_ms", "heartbeat_interval_ms"):
        if getattr(args, name) <= 0:
            raise InvalidConfigurationError(f"--{name.replace('_', '-')} must be > 0")
    if args.heartbeat_interval_ms >= args.session_timeout_ms:
        raise InvalidConfigurationError(
            "--heartbeat-interval-ms must be below --session-timeout-ms"
        )
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="metactl-chaos-"))
    schedule = load_schedule(args.schedule) if args.schedule else None
    if schedule is not None:
        check_brokers(schedule, args.brokers, args.controllers, args.etcd)
    if args.lease_ttl_s < 1:
        raise InvalidConfigurationError("--lease-ttl-s must be at least 1")
    cfg = ChaosConfig(
        data_dir=data_dir,
        brokers=args.brokers,
        partitions=args.partitions,
        rf=args.rf,
        min_isr=args.min_isr,
        strategy=args.strategy,
        **rule_mode(args),
        lossy_kills=args.lossy_kills,
        duration_s=args.duration,
        seed=args.seed,
        schedule=schedule,
        producers=args.producers,
        batch=args.batch,
        operator_elect=args.operator_elect,
        controllers=args.controllers,
        etcd=args.etcd,
        base_port=args.base_port,
        client=args.client,
        timing=Timing(
            heartbeat_ms=args.heartbeat_interval_ms,
            session_ms=args.session_timeout_ms,
            flush_ms=args.flush_interval_ms,
            lease_ttl_s=args.lease_ttl_s,
        ),
    )
    try:
        cfg.validate()
    except InvalidRequestError as exc:
        # chaos.config names a bad flag INVALID_REQUEST; to this command it is a usage error.
        raise InvalidConfigurationError(exc.message) from None
    if data_dir.exists() and any(data_dir.iterdir()):
        raise InvalidConfigurationError(f"--data-dir {data_dir} is not empty")

    def started(info: dict[str, Any]) -> None:
        print("STARTED " + json.dumps(info, separators=(",", ":")), flush=True)

    bar = Progress("chaos run", cfg.duration_s, unit="s", mode=args.progress, stream=sys.stderr)
    run = ChaosRun(cfg, bar, on_started=started)
    error: BaseException | None = None

    async def main() -> None:
        task = asyncio.create_task(run.execute())
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, task.cancel)
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
        try:
            await task
        finally:
            loop.remove_signal_handler(signal.SIGINT)
            loop.remove_signal_handler(signal.SIGTERM)

    try:
        asyncio.run(main())
    except (MetactlError, OSError, RuntimeError, TimeoutError) as exc:
        error = exc
    report = build_report(run)
    if error is not None:
        report["error"] = str(error)
    if args.report is not None:
        args.report.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if args.json:
        print(json.dumps(report, separators=(",", ":")))
    else:
        print(table(report))
    if error is not None:
        print(error_line(error), file=sys.stderr)
        return EXIT_REFUSED  # docs/chaos.md: 1 for an error during the run, whatever it was
    if run.interrupted:
        return EXIT_INTERRUPTED
    silent = bool(report["lost_silent"])
    if report.get("metric_mismatch"):
        return EXIT_SILENT_LOSS  # an unclean recovery the metric miscounted: never OK
    if args.expect_silent_loss:
        return EXIT_OK if silent else EXIT_SILENT_LOSS
    return EXIT_SILENT_LOSS if silent else EXIT_OK
