"""The security and connection-limit flags every metactl process shares, and their readers.

One definition for the controller (`metactl controller serve`, `python -m controller`),
the brokers (`metactl broker run`, `python -m brokers_stub`) and the CLI's client
commands (`describe`, `brokers`, `topics create`, `elect`, `produce`, `consume`):

- `--tls-dir DIR`: the cluster's certificate directory (`metactl certs init` writes it;
  layout in protocol/tls.py). `--insecure`: no TLS at all. The two exclude each other.
- Secure by default: without `--insecure` a process looks for its certificates in
  `--tls-dir`, else `$METACTL_TLS_DIR`, else in the fallback directories its command
  names (`<data-dir>/certs` for a process with a data directory, `./data/certs`, where
  `make run` puts them, for the CLI), and fails with INVALID_CONFIG saying what to do
  when it finds none (the CLI, often run from another directory: pass the running
  cluster's directory with --tls-dir or $METACTL_TLS_DIR; `certs init` only makes new
  ones). A fallback counts only if it holds `ca.pem`; an explicit
  directory is always used, and a missing file in it is named.
- Client commands choose the principal they act as with `--principal` (`admin` by
  default; `viewer` is read-only).
- `--max-connections`, `--max-connections-per-peer`, `--max-pending-handshakes`,
  `--max-pending-handshakes-per-address`, `--max-handshakes-in-progress`,
  `--max-parked-handshakes`, `--idle-timeout-ms`, `--frame-deadline-ms`,
  `--handshake-timeout-ms`: a listener's `ServerLimits`, with its defaults.

This module parses flags and loads nothing but certificate paths: it opens no socket and
decides nothing about what a principal may do.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from metactl.errors import InvalidConfigurationError
from metactl.numbers import int_arg, long_arg
from protocol.limits import (
    DEFAULT_FRAME_DEADLINE_S,
    DEFAULT_HANDSHAKE_TIMEOUT_S,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_PEER,
    DEFAULT_MAX_HANDSHAKES_IN_PROGRESS,
    DEFAULT_MAX_PARKED_HANDSHAKES,
    DEFAULT_MAX_PENDING_HANDSHAKES,
    DEFAULT_MAX_PENDING_HANDSHAKES_PER_ADDRESS,
    ServerLimits,
)
from protocol.tls import ADMIN, CA_CERT, TlsIdentity

ENV_TLS_DIR: Final = "METACTL_TLS_DIR"
# Where `make run` (`metactl cluster up --data-dir ./data`) writes the certificates: the
# CLI's last resort, so that `metactl describe` works next to a `make run`.
CLI_FALLBACK_TLS_DIR: Final = Path("data") / "certs"


def add_tls_arguments(p: argparse.ArgumentParser, *, client: bool = False) -> None:
    """`--tls-dir` / `--insecure` (and, for a client, `--principal`)."""
    g = p.add_argument_group(
        "security",
        "mutual TLS is on by default; certificates come from --tls-dir, else "
        f"${ENV_TLS_DIR}, else "
        + ("./data/certs (where `make run` puts them)" if client else "<data-dir>/certs"),
    )
    x = g.add_mutually_exclusive_group()
    x.add_argument(
        "--tls-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="the cluster's certificate directory: a running `cluster up`'s DATA_DIR/certs "
        "(`metactl certs init --data-dir D` writes D/certs for a new cluster)",
    )
    x.add_argument(
        "--insecure",
        action="store_true",
        help="no TLS: plaintext, and no principal (anyone may act as anyone)",
    )
    if client:
        g.add_argument(
            "--principal",
            default=ADMIN,
            metavar="NAME",
            help=f"act as this certificate's principal (default {ADMIN}; viewer is read-only)",
        )


def tls_identity(
    args: Any,
    name: str,
    *,
    fallbacks: Sequence[Path] = (),
    environ: Mapping[str, str] | None = None,
    client: bool = False,
) -> TlsIdentity | None:
    """The identity `name` from the flags of `add_tls_arguments`, or None with
    `--insecure`. InvalidConfigurationError names what to do when there is none: for a
    `client` (a CLI command, most likely run from another directory than `make run`'s)
    first how to reach a running cluster's certificates, then how to make new ones."""
    if getattr(args, "insecure", False):
        return None
    env = os.environ if environ is None else environ
    explicit: Path | None = getattr(args, "tls_dir", None)
    given = "--tls-dir"
    if explicit is None and env.get(ENV_TLS_DIR):
        explicit, given = Path(env[ENV_TLS_DIR]), f"${ENV_TLS_DIR}"
    if explicit is not None:
        if not explicit.is_dir():
            raise InvalidConfigurationError(
                f"TLS directory {explicit} ({given}) does not exist: "
                + (_RUNNING if client else "")
                + "`metactl certs init --data-dir D` makes new certificates in D/certs; "
                "--insecure runs without TLS"
            )
        return TlsIdentity.from_dir(explicit, name)
    for candidate in fallbacks:
        if (candidate / CA_CERT).is_file():
            return TlsIdentity.from_dir(candidate, name)
    looked = ", ".join(
        f"{c} ({c.absolute()})" if not c.is_absolute() else str(c) for c in fallbacks
    )
    nothing = (
        f"TLS is on by default and no certificates were found (no --tls-dir, no ${ENV_TLS_DIR}"
        + (f", nothing in {looked}" if looked else "")
    )
    if client:
        raise InvalidConfigurationError(
            f"{nothing}): {_RUNNING}`metactl certs init --data-dir D` only makes new ones, "
            "for a new cluster; --insecure talks to a cluster run with --insecure"
        )
    raise InvalidConfigurationError(
        f"{nothing}): create them with `metactl certs init --data-dir D` and pass --tls-dir "
        "D/certs, or pass --insecure to run without TLS"
    )


# A client's first advice: where a running cluster's certificates are.
_RUNNING: Final = (
    f"for a running cluster pass its certificate directory, --tls-dir DIR (or export "
    f"{ENV_TLS_DIR}=DIR): `cluster up` and `make run` keep it in DATA_DIR/certs, e.g. "
    "./data/certs where they ran; "
)


def add_limit_arguments(p: argparse.ArgumentParser) -> None:
    """A listener's connection limits (`ServerLimits`), defaults shown in --help."""
    g = p.add_argument_group("connection limits")
    g.add_argument(
        "--max-connections",
        type=int_arg,
        default=DEFAULT_MAX_CONNECTIONS,
        metavar="N",
        help="authenticated client connections in all; more are closed at once (the "
        "controller's and brokers' own sessions have slots of their own) (default %(default)s)",
    )
    g.add_argument(
        "--max-connections-per-peer",
        type=int_arg,
        default=DEFAULT_MAX_CONNECTIONS_PER_PEER,
        metavar="N",
        help="open connections per principal (per address without TLS) (default %(default)s)",
    )
    g.add_argument(
        "--max-pending-handshakes",
        type=int_arg,
        default=DEFAULT_MAX_PENDING_HANDSHAKES,
        metavar="N",
        help="connections accepted but not yet authenticated, in all; a new one drops the "
        "oldest (default %(default)s)",
    )
    g.add_argument(
        "--max-pending-handshakes-per-address",
        type=int_arg,
        default=DEFAULT_MAX_PENDING_HANDSHAKES_PER_ADDRESS,
        metavar="N",
        help="connections not yet authenticated from one address; a new one drops that "
        "address's oldest (default %(default)s)",
    )
    g.add_argument(
        "--max-handshakes-in-progress",
        type=int_arg,
        default=DEFAULT_MAX_HANDSHAKES_IN_PROGRESS,
        metavar="N",
        help="TLS handshakes running at once (each holds about 300 KB); one more starts "
        "when one ends or one stalls on its client, which is dropped (default %(default)s)",
    )
    g.add_argument(
        "--max-parked-handshakes",
        type=int_arg,
        default=DEFAULT_MAX_PARKED_HANDSHAKES,
        metavar="N",
        help="dropped pending connections held open, reading nothing, until their handshake "
        "deadline, so that a flood reopening what is closed is slowed down; they cost a "
        "descriptor each; 0: closed at once (default %(default)s)",
    )
    g.add_argument(
        "--idle-timeout-ms",
        type=long_arg,
        default=int(DEFAULT_IDLE_TIMEOUT_S * 1000),
        metavar="MS",
        help="close a connection without a request for this long (default %(default)s)",
    )
    g.add_argument(
        "--frame-deadline-ms",
        type=long_arg,
        default=int(DEFAULT_FRAME_DEADLINE_S * 1000),
        metavar="MS",
        help="a frame, once begun, must arrive whole within this (default %(default)s)",
    )
    g.add_argument(
        "--handshake-timeout-ms",
        type=long_arg,
        default=int(DEFAULT_HANDSHAKE_TIMEOUT_S * 1000),
        metavar="MS",
        help="a TLS handshake must finish within this of the accept (default %(default)s)",
    )


def server_limits(args: Any) -> ServerLimits:
    """The `ServerLimits` of `add_limit_arguments`' flags; INVALID_CONFIG if one is < 1
    (`--max-parked-handshakes`: < 0)."""
    values = {
        "--max-connections": args.max_connections,
        "--max-connections-per-peer": args.max_connections_per_peer,
        "--max-pending-handshakes": args.max_pending_handshakes,
        "--max-pending-handshakes-per-address": args.max_pending_handshakes_per_address,
        "--max-handshakes-in-progress": args.max_handshakes_in_progress,
        "--idle-timeout-ms": args.idle_timeout_ms,
        "--frame-deadline-ms": args.frame_deadline_ms,
        "--handshake-timeout-ms": args.handshake_timeout_ms,
    }
    for flag, value in values.items():
        if value < 1:
            raise InvalidConfigurationError(f"{flag} must be >= 1, got {value}")
    if args.max_parked_handshakes < 0:
        raise InvalidConfigurationError(
            f"--max-parked-handshakes must be >= 0, got {args.max_parked_handshakes}"
        )
    return ServerLimits(
        max_connections=args.max_connections,
        max_connections_per_peer=args.max_connections_per_peer,
        idle_timeout_s=args.idle_timeout_ms / 1000,
        frame_deadline_s=args.frame_deadline_ms / 1000,
        handshake_timeout_s=args.handshake_timeout_ms / 1000,
        max_pending_handshakes=args.max_pending_handshakes,
        max_pending_handshakes_per_address=args.max_pending_handshakes_per_address,
        max_handshakes_in_progress=args.max_handshakes_in_progress,
        max_parked_handshakes=args.max_parked_handshakes,
    )
