"""`metactl broker run …`: run one stub broker process in the foreground; `metactl broker
start --id N --data-dir D`: bring a broker of a `cluster up` cluster back.

`run` hands over to `brokers_stub.cli`; the arguments are documented there and shared
with `python -m brokers_stub`. Logs are JSON lines on stderr; the one line on stdout is
`READY broker=<id> epoch=<epoch> endpoint=<host:port>` (and `metrics=<host:port>` with
`--metrics`, `kafka=<host:port>` with `--kafka-listen`).

`start` asks the `cluster up` running on D (through its control socket, `localcluster.control`)
to run broker N again with the command line it recorded in ``D/cluster-up.json``: the
broker is `cluster up`'s child again (supervised, stopped in order on Ctrl-C, its log in
``D/logs``), and the command returns once it is ready (registered with the controller).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from metactl.numbers import decimal_arg, int_arg
from ops.cli import EXIT_INTERRUPTED, EXIT_OK, HELP_FORMAT, examples

START_TIMEOUT_S = 90.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from brokers_stub.cli import add_arguments, run

    parser = subparsers.add_parser(
        "broker",
        help="run a stub broker, or bring one of `cluster up` back",
        description="Run a lightweight broker process against a controller service "
        "(run), or start a broker of a running `cluster up` again (start).",
        epilog=examples(
            "metactl broker run --id 1 --controller 127.0.0.1:9093 --data-dir ./data/broker-1 "
            "--tls-dir ./data/certs",
            "metactl broker start --id 1 --data-dir ./data",
        ),
        formatter_class=HELP_FORMAT,
    )
    parser.set_defaults(help_parser=parser)
    commands = parser.add_subparsers(dest="broker_command", metavar="SUBCOMMAND", required=True)
    run_parser = commands.add_parser(
        "run",
        help="register, heartbeat, replicate; stop cleanly on SIGTERM/SIGINT",
        description="Run one broker until SIGTERM or SIGINT (controlled shutdown).",
        epilog=examples(
            "metactl broker run --id 1 --controller 127.0.0.1:9093 --data-dir ./data/broker-1 "
            "--tls-dir ./data/certs",
            "metactl broker run --id 2 --controller 127.0.0.1:9093 --data-dir /tmp/b2 --insecure",
        ),
        formatter_class=HELP_FORMAT,
    )
    add_arguments(run_parser)
    run_parser.set_defaults(func=run)

    start = commands.add_parser(
        "start",
        help="bring a broker of a `cluster up` cluster back, with its recorded settings",
        description="Start broker N of the `metactl cluster up` running on DATA_DIR again "
        "(after kill -9, or a stop), with the command line cluster up recorded for it in "
        "DATA_DIR/cluster-up.json. cluster up runs and supervises it, as it did the first "
        "one; this returns once it is registered. After a kill -9 it registers unclean: "
        "out of every ISR and ELR until it catches up (KIP-966).",
        epilog=examples(
            "metactl broker start --id 1 --data-dir ./data",
            "metactl broker start --id 3 --data-dir /tmp/c --timeout 120",
        ),
        formatter_class=HELP_FORMAT,
    )
    start.add_argument("--id", dest="broker_id", type=int_arg, required=True, help="broker id")
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
        help=f"how long to wait for the broker to be ready (default {START_TIMEOUT_S:.0f})",
    )
    start.set_defaults(func=cmd_broker_start)


def cmd_broker_start(args: argparse.Namespace) -> int:
    from localcluster.control import AskInterrupted, ask

    data = Path(args.data_dir)
    try:
        answer = ask(data, {"start_broker": args.broker_id}, args.timeout)
    except AskInterrupted:
        # Ctrl-C ends the wait, not the start, which `cluster up` has in hand.
        log = data.resolve() / "logs" / f"broker-{args.broker_id}.log"
        print(
            f"interrupted: cluster up goes on starting broker {args.broker_id} (its log: "
            f"{log}); `metactl brokers` shows it once it registers",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_INTERRUPTED
    ready = dict(p.split("=", 1) for p in str(answer.get("ready", "")).split()[1:] if "=" in p)
    where = ", ".join(
        f"{k} {ready[k]}" for k in ("epoch", "endpoint", "metrics", "kafka") if k in ready
    )
    print(
        f"Broker {args.broker_id} started (pid {answer.get('pid')}; {where}); "
        f"cluster up supervises it; its log: {answer.get('log')}"
    )
    return EXIT_OK
