"""Entry point of the `metactl` command: builds the argument parser from command modules.

Each command module exposes `register(subparsers)`, which adds its sub-commands and sets
`func` on them; `func(args)` returns the exit status. Imports are lazy so that
`metactl --help` stays fast even though some commands pull in Spark.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from metactl import __version__
from metactl.logs import configure as configure_logs

# Modules that contribute sub-commands, in the order they appear in --help.
COMMAND_MODULES = (
    "ops.log_cmds",
    "ops.export_cmds",  # adds `log export` to the `log` group, so it comes after ops.log_cmds
    "ops.scenario_cmds",
    "ops.controller_cmds",
    "ops.broker_cmds",
    "ops.describe_cmds",  # describe, brokers
    "ops.cluster_cmds",
    "ops.certs_cmds",
    "ops.audit_cmds",
    "ops.simulate_cmds",
    "ops.data_cmds",
    "ops.chaos_cmds",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="metactl",
        description="metactl: a KIP-966 controller metadata service and its tools",
    )
    parser.add_argument("--version", action="version", version=f"metactl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue  # a command module not written yet
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # The CLI prints its own results; library logs go to stderr, readable, warnings up.
    configure_logs(json=False, level=logging.WARNING)
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        status = func(args)
    except BrokenPipeError:
        # The reader went away (`metactl log dump | head`): not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
