"""`metactl controller serve`: run the controller service (see controller/runtime/serve.py)."""

from __future__ import annotations

import argparse
from typing import Any

from ops.cli import HELP_FORMAT, examples


def register(sub: Any) -> None:
    ctl = sub.add_parser(
        "controller",
        help="run the controller service",
        description="The controller service: the KIP-966 controller over its durable log.",
        epilog=examples(
            "metactl controller serve --data-dir ./data/controller --listen 127.0.0.1:9093 "
            "--tls-dir ./data/certs",
            "metactl controller serve --data-dir /tmp/ctl --listen 127.0.0.1:0 --insecure",
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


def _serve(args: argparse.Namespace) -> int:
    from controller.runtime.serve import run

    return run(args)
