"""`metactl storage format|info|random-uuid`: a data directory's identity, as
`kafka-storage` does it.

* ``format --data-dir D [--cluster-id|-t ID] [--node-id N] [--ignore-formatted|-g]`` writes
  D/meta.properties (`metadata_log.identity`): a random cluster id unless one is given
  (printed either way), a random directory id, the node id if given. A directory that
  holds a metadata log or replicas from an earlier version is formatted as holding them
  (``log.created=true``), with the log's cluster id if it records one. A formatted
  directory is refused (STORAGE_ALREADY_FORMATTED) unless ``--ignore-formatted``, which
  leaves it as it is; nothing is written unless every directory can be formatted.
* ``info --data-dir D [--metadata-log URL] [--json]`` shows the identity and what the
  directory holds, and whether a controller or broker would start on it: exit 0 if it
  would, else the refusal it would meet as ``error: CODE: ...`` and exit 1.
* ``random-uuid`` prints a new id in Kafka's form (for ``--cluster-id``).

kafka-storage's ``-c/--config`` (its server.properties) has no counterpart: metactl has
no config file, and ``ops.cli.KAFKA_FLAGS`` answers it with the flags to use instead.

Formatting and inspecting are `localcluster.storage`'s (`format_directories` is what
`metactl cluster up` formats with on a first start too). This module parses, calls and
prints; the file and the checks are `metadata_log.identity`,
`metadata_log.identity_check` and `brokers_stub.identity_check` (imported when a command
runs, not to build its parser: issue 34).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from metadata_log.etcd.tls import (
    add_etcd_tls_arguments,
)
from ops.cli import EXIT_OK, HELP_FORMAT, examples

__all__ = ["register"]


def register(sub: Any) -> None:
    s = sub.add_parser(
        "storage",
        help="format a data directory, or show its identity (as kafka-storage)",
        description="A data directory's identity, meta.properties (docs/operations.md, "
        "Storage identity): its cluster, its node, and whether its log was created.",
        epilog=examples(
            "metactl storage format --data-dir ./data/controller",
            "metactl storage info --data-dir ./data/controller",
        ),
        formatter_class=HELP_FORMAT,
    )
    s.set_defaults(help_parser=s)
    ssub = s.add_subparsers(dest="storage_command", metavar="SUBCOMMAND")

    f = ssub.add_parser(
        "format",
        help="write a data directory's meta.properties before its first start",
        description="Write meta.properties into each data directory: the cluster id "
        "(printed), a random directory id, the node id if given. A directory holding a "
        "metadata log or replicas from an earlier version is formatted as holding them. "
        "A formatted directory is refused unless --ignore-formatted; nothing is written "
        "unless every directory can be formatted.",
        epilog=examples(
            "metactl storage format --data-dir ./data/controller",
            "metactl storage format --data-dir ./data/broker-1 --cluster-id "
            "MkU3OEVBNTcwNTJENDM2Qk --node-id 1",
            "metactl storage format --data-dir ./data/controller --ignore-formatted",
            "metactl storage format -t MkU3OEVBNTcwNTJENDM2Qk --data-dir ./data/controller -g",
        ),
        formatter_class=HELP_FORMAT,
    )
    f.add_argument(
        "--data-dir",
        type=Path,
        action="append",
        required=True,
        metavar="D",
        help="a directory to format (created if absent); repeat for several (required)",
    )
    f.add_argument(
        "--cluster-id",
        "-t",
        default=None,
        metavar="ID",
        help="the cluster's id (default: the log's, if the directory holds one that "
        "records it; else a new random one, printed; see `storage random-uuid`); -t as "
        "kafka-storage",
    )
    f.add_argument(
        "--node-id",
        default=None,
        metavar="N",
        help="the node's id: a broker's --id, or a controller's --node-id (default: none "
        "recorded; the first start records it)",
    )
    f.add_argument(
        "--ignore-formatted",
        "-g",
        action="store_true",
        help="leave formatted directories as they are instead of failing; -g as kafka-storage",
    )
    f.set_defaults(func=cmd_format)

    i = ssub.add_parser(
        "info",
        help="show a data directory's identity and whether a process would start on it",
        description="Show meta.properties and what the directory holds (the metadata log, "
        "the replicas), and whether a controller or broker would start on it: exit 0 if "
        "it would, else its refusal as `error: CODE: ...` and exit 1.",
        epilog=examples(
            "metactl storage info --data-dir ./data/controller",
            "metactl storage info --data-dir ./data/controller-1 "
            "--metadata-log etcd://127.0.0.1:2379/metactl --json",
        ),
        formatter_class=HELP_FORMAT,
    )
    i.add_argument("--data-dir", type=Path, required=True, metavar="D", help="the directory")
    i.add_argument(
        "--metadata-log",
        default=None,
        metavar="URL",
        help="the controller's --metadata-log, if not the SQLite log in D: a SQLite path, "
        "or etcd://HOST:PORT/PREFIX (read, never created)",
    )
    i.add_argument("--json", action="store_true", help="one JSON object instead of text")
    add_etcd_tls_arguments(i)
    i.set_defaults(func=cmd_info)

    r = ssub.add_parser(
        "random-uuid",
        help="print a new random id, for --cluster-id",
        description="Print a new random id in Kafka's form (22 characters of URL-safe "
        "base64), as `kafka-storage random-uuid` does.",
        epilog=examples("metactl storage random-uuid"),
        formatter_class=HELP_FORMAT,
    )
    r.set_defaults(func=cmd_random_uuid)


# --- format ----------------------------------------------------------------------------


def cmd_format(args: argparse.Namespace) -> int:
    from localcluster.storage import format_directories

    done = format_directories(
        args.data_dir,
        cluster_id=args.cluster_id,
        node_id=args.node_id,
        ignore_formatted=args.ignore_formatted,
    )
    written = [f for f in done if f.written]
    if written:
        print(f"cluster.id: {written[0].identity.cluster_id}")
    for f in done:
        if not f.written:
            cluster = f.identity.cluster_id
            print(f"{f.data_dir}: already formatted (cluster.id {cluster}); left as it is")
            continue
        node = f" node.id {f.identity.node_id}," if f.identity.node_id is not None else ""
        print(
            f"{f.data_dir}: formatted (directory.id {f.identity.directory_id},{node} "
            f"holding {f.holds})"
        )
    return EXIT_OK


def cmd_random_uuid(args: argparse.Namespace) -> int:
    from metadata_log.identity import new_id

    print(new_id())
    return EXIT_OK


def cmd_info(args: argparse.Namespace) -> int:
    from localcluster.storage import inspect
    from metadata_log.identity import IDENTITY_FILE

    report, problem = inspect(args.data_dir, args.metadata_log)
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        print(f"data directory: {report['data_dir']}")
        identity = report["identity"]
        if identity is None:
            print(f"identity: none ({IDENTITY_FILE} absent)")
        else:
            print(f"identity: {args.data_dir / IDENTITY_FILE}")
            for key, value in identity.items():
                print(f"  {key}={value}")
        log = report.get("metadata_log")
        if log is not None:
            facts = [log["state"]]
            if "bytes" in log:
                facts.append(f"{log['bytes']:,} bytes")
            if "why" in log:
                facts.append(log["why"])
            if "cluster_id" in log:
                facts.append(f"cluster.id {log['cluster_id']}")
            print(f"metadata log: {log['location']}: {', '.join(facts)}")
        replicas = report.get("replicas")
        if replicas is not None:
            clean = "clean" if replicas["clean_shutdown"] else "not clean"
            print(
                f"replicas: {replicas['location']}: {replicas['files']} replica files, last "
                f"shutdown {clean}"
            )
        print(f"status: {report['status']}")
    if problem is not None:
        raise problem  # its one line on stderr and its status (1), as a start would
    return EXIT_OK
