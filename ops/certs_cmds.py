"""`metactl certs init --data-dir D [--brokers 1,2,3]`: a cluster's CA and certificates.

Writes D/certs (layout in protocol/tls.py) through `localcluster.certs.init_certs`: the CA, and a
certificate for `controller`, `admin`, `viewer` and `broker-<id>` for each id; and, in
D/certs/etcd, the metadata log's etcd CA with the members' `server` and `peer`
certificates and the `controller` and `admin` client certificates
(`localcluster.certs.init_etcd_certs`: a CA of its own, docs/ha.md says why). Existing files
are kept, so running it again keeps the CA (and every certificate it signed) and only
adds what is missing, e.g. a new broker. Prints what it made and what it kept, and
how the processes and the CLI find the directory.

Exit status: 0 done; 2 bad flags, a directory that cannot be written or one that holds
an unusable CA (INVALID_CONFIG); otherwise docs/cli.md's table. Errors are named (`error:
CODE: ...`), never a traceback. This module only parses and prints: the certificates
themselves are `localcluster.certs`' (imported, with the `cryptography` package, when
the command runs, not to build its parser: issue 34).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from metactl.errors import InvalidConfigurationError
from metactl.numbers import NumberFormatError, kafka_int
from ops.cli import EXIT_OK, HELP_FORMAT, examples

DEFAULT_BROKERS = "1,2,3"


def register(sub: Any) -> None:
    c = sub.add_parser(
        "certs",
        help="the cluster's certificate authority and certificates",
        description="The cluster's certificate authority and certificates (docs/protocol.md, "
        "Security).",
        epilog=examples("metactl certs init --data-dir ./data"),
        formatter_class=HELP_FORMAT,
    )
    c.set_defaults(help_parser=c)
    csub = c.add_subparsers(dest="certs_command", metavar="SUBCOMMAND")
    i = csub.add_parser(
        "init",
        help="create (or complete) DATA_DIR/certs: a CA, controller, admin, viewer, brokers, "
        "and etcd's",
        description="Create the cluster CA in DATA_DIR/certs if absent and a certificate "
        "for controller, admin, viewer and broker-<id> for each --brokers id that has none; "
        "and in DATA_DIR/certs/etcd the etcd CA (a CA of its own: etcd admits any "
        "certificate of its CA with every right), the members' server and peer "
        "certificates and the controller and admin client certificates. Existing files are "
        "kept: re-running keeps the CAs and adds new names.",
        epilog=examples(
            "metactl certs init --data-dir ./data",
            "metactl certs init --data-dir ./data --brokers 1,2,3,4",
        ),
        formatter_class=HELP_FORMAT,
    )
    i.add_argument(
        "--data-dir", type=Path, required=True, help="the certificates go in D/certs (required)"
    )
    i.add_argument(
        "--brokers",
        default=DEFAULT_BROKERS,
        metavar="IDS",
        help=f"broker ids, comma-separated (default {DEFAULT_BROKERS})",
    )
    i.set_defaults(func=cmd_init)


def parse_broker_ids(text: str) -> list[int]:
    """'1,2,3' -> [1, 2, 3]; InvalidConfigurationError for anything else."""
    from protocol.tls import MAX_BROKER_ID

    ids: list[int] = []
    for raw in text.split(","):
        try:
            broker = kafka_int(raw, 0, MAX_BROKER_ID)
        except NumberFormatError:
            raise InvalidConfigurationError(
                f"--brokers takes broker ids 0..{MAX_BROKER_ID} separated by commas, "
                f"e.g. 1,2,3; got {text!r}"
            ) from None
        if broker not in ids:
            ids.append(broker)
    return ids


def cmd_init(args: argparse.Namespace) -> int:
    from localcluster.certs import (
        ETCD_CLIENTS,
        default_names,
        etcd_dir,
        init_certs,
        init_etcd_certs,
    )
    from protocol.flags import ENV_TLS_DIR
    from protocol.tls import CA_CERT

    ids = parse_broker_ids(args.brokers)
    certs = (args.data_dir / "certs").resolve()
    names = default_names(ids)
    had_ca = (certs / CA_CERT).exists()
    had_etcd_ca = (etcd_dir(certs) / CA_CERT).exists()
    try:
        created = init_certs(certs, names)
        etcd_created = init_etcd_certs(certs)
    except OSError as exc:
        raise InvalidConfigurationError(f"cannot write certificates in {certs}: {exc}") from None
    kept = [n for n in names if n not in created]
    print(f"certificates in {certs}")
    print(f"  CA:       {CA_CERT} ({'kept' if had_ca else 'created'})")
    print(f"  created:  {', '.join(created) or 'nothing'}")
    if kept:
        print(f"  kept:     {', '.join(kept)}")
    etcd = etcd_dir(certs)
    print(
        f"  use:      --tls-dir {certs} on the controller, the brokers and the CLI, or\n"
        f"            export {ENV_TLS_DIR}={certs}\n"
        f"  etcd:     a CA of its own in {etcd} ({'kept' if had_etcd_ca else 'created'}); "
        f"created: {', '.join(n.removeprefix('etcd/') for n in etcd_created) or 'nothing'}\n"
        f"            clients ({', '.join(ETCD_CLIENTS)}): --etcd-cacert {etcd / CA_CERT} "
        f"--etcd-cert {etcd}/admin.pem --etcd-key {etcd}/admin-key.pem"
    )
    return EXIT_OK
