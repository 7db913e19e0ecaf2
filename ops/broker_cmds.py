"""`metactl broker run …`: run one stub broker process in the foreground.

Adds the sub-command and hands over to `brokers_stub.cli`; the arguments are documented
there and shared with `python -m brokers_stub`. Logs are JSON lines on stderr; the one
line on stdout is `READY broker=<id> epoch=<epoch> endpoint=<host:port>`.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from brokers_stub.cli import add_arguments, run

    parser = subparsers.add_parser(
        "broker",
        help="run a stub broker",
        description="Run a lightweight broker process against a controller service.",
    )
    commands = parser.add_subparsers(dest="broker_command", metavar="SUBCOMMAND", required=True)
    run_parser = commands.add_parser(
        "run",
        help="register, heartbeat, replicate; stop cleanly on SIGTERM/SIGINT",
        description="Run one broker until SIGTERM or SIGINT (controlled shutdown).",
    )
    add_arguments(run_parser)
    run_parser.set_defaults(func=run)
