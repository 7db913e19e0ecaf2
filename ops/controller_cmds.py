"""`metactl controller serve`: run the controller service (see controller/runtime/serve.py)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    ctl = sub.add_parser("controller", help="run the controller service")
    csub = ctl.add_subparsers(dest="controller_command", metavar="SUBCOMMAND")
    serve = csub.add_parser("serve", help="serve brokers and operators over TCP")
    from controller.runtime.serve import add_arguments

    add_arguments(serve)
    serve.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from controller.runtime.serve import run

    return run(args)
