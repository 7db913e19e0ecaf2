"""`metactl broker run …`: run one stub broker process in the foreground.

Adds the sub-command and hands over to `brokers_stub.cli`; the arguments are documented
there and shared with `python -m brokers_stub`. Logs are JSON lines on stderr; the one
line on stdout is `READY broker=<id> epoch=<epoch> endpoint=<host:port>`.
"""

from __future__ import annotations

import argparse

from ops.cli import HELP_FORMAT, examples


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from brokers_stub.cli import add_arguments, run

    parser = subparsers.add_parser(
        "broker",
        help="run a stub broker",
        description="Run a lightweight broker process against a controller service.",
        epilog=examples(
            "metactl broker run --id 1 --controller 127.0.0.1:9093 --data-dir ./data/broker-1 "
            "--tls-dir ./data/certs",
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
