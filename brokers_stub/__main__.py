"""`python -m brokers_stub …`: run one broker process (same arguments as `metactl broker run`).

Only parses arguments and hands over to `brokers_stub.cli.run`.
"""

from __future__ import annotations

import argparse
import sys

from brokers_stub.cli import add_arguments, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m brokers_stub", description="Run one metactl stub broker."
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
