"""`metactl controller serve`: run the controller service (see controller/runtime/serve.py);
`metactl controller start --node-id cN --data-dir D`: bring a controller of a `cluster up`
cluster back.

`start` asks the `cluster up` running on D (through its control socket,
`localcluster.control`) to run controller N again with the command line it recorded in
``D/cluster-up.json``, as `metactl broker start` does for a broker: the controller is
`cluster up`'s child again (supervised, stopped in order on Ctrl-C, its log in
``D/logs``), back on the addresses it had, and the command returns once it is ready (on
etcd, a standby). Refusals are named: no cluster up on D (NETWORK_EXCEPTION), no such
node (INVALID_CONFIG), one that runs (INVALID_REQUEST).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from metactl.numbers import decimal_arg
from ops.cli import EXIT_INTERRUPTED, EXIT_OK, HELP_FORMAT, examples

START_TIMEOUT_S = 90.0


def register(sub: Any) -> None:
    ctl = sub.add_parser(
        "controller",
        help="run the controller service, or bring one of `cluster up` back",
        description="The controller service: the KIP-966 controller over its durable log "
        "(serve), or a controller of a running `cluster up` started again (start).",
        epilog=examples(
            "metactl controller serve --data-dir ./data/controller --listen 127.0.0.1:9093 "
            "--tls-dir ./data/certs",
            "metactl controller serve --data-dir /tmp/ctl --listen 127.0.0.1:0 --insecure",
            "metactl controller start --node-id c2 --data-dir ./data",
        ),
        formatter_class=HELP_FORMAT,
    )
    ctl.set_defaults(help_parser=ctl)
    csub = ctl.add_subparsers(dest="controller_command", metavar="SUBCOMMAND")
    serve = csub.add_parser(
        "serve",
        help="serve brokers and operators over TCP",
        description="Serve brokers and operators over TCP until SIGTERM or Ctrl-C. Prints "
        "one READY line on stdout once it listens; logs are JSON lines on stderr.",
        epilog=examples(
            "metactl controller serve --data-dir ./data/controller --listen 127.0.0.1:9093 "
            "--metrics 127.0.0.1:9400 --tls-dir ./data/certs",
            "metactl controller serve --data-dir /tmp/ctl --listen 127.0.0.1:0 --insecure",
            "metactl controller serve --data-dir ./data/controller --verify-log full --insecure",
        ),
        formatter_class=HELP_FORMAT,
    )
    from controller.runtime.serve import add_arguments

    add_arguments(serve)
    serve.set_defaults(func=_serve)

    start = csub.add_parser(
        "start",
        help="bring a controller of a `cluster up` cluster back, with its recorded settings",
        description="Start controller cN of the `metactl cluster up` running on DATA_DIR "
        "again (after kill -9, or a stop), with the command line cluster up recorded for it "
        "in DATA_DIR/cluster-up.json, on the addresses it had. cluster up runs and "
        "supervises it, as it did the first one; this returns once it is ready. On etcd it "
        "comes back a hot standby (`metactl quorum describe` shows it).",
        epilog=examples(
            "metactl controller start --node-id c2 --data-dir ./data",
            "metactl controller start --node-id c1 --data-dir /tmp/c --timeout 120",
        ),
        formatter_class=HELP_FORMAT,
    )
    start.add_argument(
        "--node-id",
        required=True,
        metavar="cN",
        help="the controller: cN for cluster up's controller N (its --node-id on etcd)",
    )
    start.add_argument(
        "--data-dir",
        type=Path,
        default=Path("./data"),
        help="the data directory `cluster up` runs on (default ./data)",
    )
    start.add_argument(
        "--timeout",
        type=decimal_arg,
        default=START_TIMEOUT_S,
        metavar="S",
        help=f"how long to wait for the controller to be ready (default {START_TIMEOUT_S:.0f})",
    )
    start.set_defaults(func=cmd_controller_start)


def _serve(args: argparse.Namespace) -> int:
    from controller.runtime.serve import run

    return run(args)


def cmd_controller_start(args: argparse.Namespace) -> int:
    from localcluster.control import AskInterrupted, ask

    data = Path(args.data_dir)
    try:
        answer = ask(data, {"start_controller": args.node_id}, args.timeout)
    except AskInterrupted:
        # Ctrl-C ends the wait, not the start, which `cluster up` has in hand.
        print(
            f"interrupted: cluster up goes on starting controller {args.node_id} (its log: "
            f"{_log_of(data, args.node_id)}); `metactl quorum describe` shows it once "
            "it is up",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_INTERRUPTED
    ready = dict(p.split("=", 1) for p in str(answer.get("ready", "")).split()[2:] if "=" in p)
    where = ", ".join(
        f"{k} {ready[k]}" for k in ("role", "listen", "metrics", "kafka") if k in ready
    )
    print(
        f"Controller {args.node_id} started (pid {answer.get('pid')}; {where}); "
        f"cluster up supervises it; its log: {answer.get('log')}"
    )
    return EXIT_OK


def _log_of(data: Path, node_id: str) -> Path:
    """Where `cluster up` logs controller `node_id` ("c2" -> logs/controller-2.log)."""
    logs = data.resolve() / "logs"
    numbered = logs / f"controller-{node_id.removeprefix('c')}.log"
    return numbered if numbered.exists() else logs / "controller.log"
