"""`metactl storage format|info|random-uuid`: a data directory's identity, as
`kafka-storage` does it.

* ``format --data-dir D [--cluster-id ID] [--node-id N] [--ignore-formatted]`` writes
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

`format_directories` is also what `metactl cluster up` formats with on a first start.
This module parses, decides what to write and prints; the file and the checks are
`metadata_log.identity`, `metadata_log.identity_check` and `brokers_stub.identity_check`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metactl.errors import (
    InconsistentClusterIdError,
    LogDirNotFoundError,
    MetactlError,
    MetadataLogMissingError,
    StorageAlreadyFormattedError,
)
from metadata_log.etcd.tls import (
    PROCESS_DEFAULT,
    EtcdTls,
    ProcessDefault,
    add_etcd_tls_arguments,
)
from metadata_log.identity import (
    IDENTITY_FILE,
    Identity,
    locked,
    new_id,
    read_identity,
    valid_id,
    write_identity,
)
from metadata_log.identity_check import (
    SqliteLogState,
    inspect_sqlite_log,
    sqlite_location,
    sqlite_verdict,
)
from ops.cli import EXIT_OK, HELP_FORMAT, examples

__all__ = ["Formatted", "etcd_log_info", "format_directories", "inspect", "register"]


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
        default=None,
        metavar="ID",
        help="the cluster's id (default: the log's, if the directory holds one that "
        "records it; else a new random one, printed; see `storage random-uuid`)",
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
        action="store_true",
        help="leave formatted directories as they are instead of failing",
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


@dataclass(frozen=True)
class Formatted:
    data_dir: Path
    identity: Identity
    written: bool  # False: it was formatted already and left as it is
    holds: str  # what it holds: "nothing yet", "a metadata log (N bytes)", "replicas"


def _holds(data_dir: Path, log: SqliteLogState) -> str | None:
    from brokers_stub.storage import REPLICAS_DIR

    if log.kind == "present":
        return f"a metadata log ({log.size:,} bytes)"
    if (data_dir / REPLICAS_DIR).is_dir():
        return "replicas"
    return None


def format_directories(
    dirs: list[Path],
    *,
    cluster_id: str | None = None,
    node_id: str | None = None,
    ignore_formatted: bool = False,
) -> list[Formatted]:
    """Format every directory of `dirs` with one cluster id, or none of them: a
    formatted one is StorageAlreadyFormattedError (skipped with `ignore_formatted`), a
    log of another cluster InconsistentClusterIdError."""
    if cluster_id is not None:
        valid_id(cluster_id, "--cluster-id")
    if node_id is not None:
        valid_id(node_id, "--node-id")
    plans: list[tuple[Path, Identity | None, SqliteLogState]] = []
    for d in dirs:
        if d.exists() and not d.is_dir():
            raise NotADirectoryError(20, "Not a directory", str(d))
        existing = read_identity(d)
        if existing is not None and not ignore_formatted:
            raise StorageAlreadyFormattedError(
                f"{d} is already formatted (cluster.id {existing.cluster_id}, "
                f"{d / IDENTITY_FILE}); --ignore-formatted leaves formatted directories as "
                "they are"
            )
        plans.append((d, existing, inspect_sqlite_log(d / "metadata.log.sqlite")))
    recorded = {s.cluster_id for d, e, s in plans if e is None and s.cluster_id is not None}
    if cluster_id is None and len(recorded) > 1:
        raise InconsistentClusterIdError(
            f"the directories' metadata logs belong to several clusters: {sorted(recorded)}"
        )
    chosen = cluster_id or (recorded.pop() if recorded else new_id())
    out: list[Formatted] = []
    for d, existing, log in plans:
        if existing is not None:
            out.append(Formatted(d, existing, False, "as it is"))
            continue
        if log.cluster_id not in (None, chosen):
            raise InconsistentClusterIdError(
                f"{log.path} is the metadata log of cluster {log.cluster_id!r}, not of "
                f"{chosen!r}: refusing to format its directory for another cluster"
            )
        holds = _holds(d, log)
        identity = Identity(
            cluster_id=chosen,
            directory_id=new_id(),
            node_id=node_id,
            log_created=holds is not None,
        )
        out.append(Formatted(d, identity, True, holds or "nothing yet"))
    for f in out:
        if not f.written:
            continue
        with locked(f.data_dir):
            if read_identity(f.data_dir) is not None and not ignore_formatted:
                raise StorageAlreadyFormattedError(f"{f.data_dir} was formatted meanwhile")
            write_identity(f.data_dir, f.identity)
    return out


def cmd_format(args: argparse.Namespace) -> int:
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
    print(new_id())
    return EXIT_OK


# --- info ------------------------------------------------------------------------------


def _log_report(state: SqliteLogState) -> dict[str, Any]:
    out: dict[str, Any] = {"location": str(state.path), "state": state.kind}
    if state.kind != "absent":
        out["bytes"] = state.size
    if state.why:
        out["why"] = state.why
    if state.cluster_id is not None:
        out["cluster_id"] = state.cluster_id
    return out


async def etcd_log_info(
    url: str, *, tls: EtcdTls | ProcessDefault | None = PROCESS_DEFAULT
) -> dict[str, Any]:
    """An etcd log's location, state (absent, present) and cluster id; read only. `tls`:
    TLS to etcd (default: the process's, from the command's --etcd-* flags)."""
    from metadata_log.etcd.client import Etcd, EtcdTarget
    from metadata_log.etcd.layout import Keys, open_meta

    target = EtcdTarget.parse(url, tls=tls)
    etcd = await Etcd.connect(target)
    try:
        found, _ = await etcd.get(Keys(target).meta)
        if found is None:
            return {"location": target.url, "state": "absent"}
        meta = await open_meta(etcd, create=False, cluster_id=None)
    finally:
        await etcd.close()
    return {"location": target.url, "state": "present", "cluster_id": meta.cluster_id}


def inspect(
    data_dir: Path, metadata_log: str | None = None
) -> tuple[dict[str, Any], MetactlError | None]:
    """What `storage info` reports (the identity, the log, the replicas, the status),
    and the refusal a start would meet (None if it would start)."""
    from brokers_stub.identity_check import broker_verdict
    from brokers_stub.replica_log import replica_files
    from brokers_stub.storage import CLEAN_SHUTDOWN_FILE, REPLICAS_DIR

    if not data_dir.is_dir():
        raise LogDirNotFoundError(f"no directory {data_dir}")
    report: dict[str, Any] = {"data_dir": str(data_dir)}
    problem: MetactlError | None = None
    identity: Identity | None = None
    try:
        identity = read_identity(data_dir)
    except MetactlError as exc:
        problem = exc
    report["identity"] = identity.fields() if identity is not None else None
    was = identity.log_location if identity is not None else None
    if metadata_log is None and was is not None and was.startswith("etcd://"):
        metadata_log = was  # the controller's log at its last start
    path = sqlite_location(data_dir, metadata_log)
    state = inspect_sqlite_log(path) if path is not None else None
    replicas = data_dir / REPLICAS_DIR
    if replicas.is_dir():
        report["replicas"] = {
            "location": str(replicas),
            "files": len(replica_files(replicas)),
            "clean_shutdown": (data_dir / CLEAN_SHUTDOWN_FILE).is_file(),
        }
    role = identity.role if identity is not None else None
    if role is None:
        log_here = state is not None and state.kind != "absent"
        role = "controller" if log_here or not replicas.is_dir() else "broker"
    report["role"] = role
    if role == "controller" and state is not None:
        report["metadata_log"] = _log_report(state)
    elif role == "controller" and metadata_log is not None and metadata_log.startswith("etcd://"):
        report["metadata_log"] = asyncio.run(etcd_log_info(metadata_log))
    try:
        if problem is not None:
            raise problem
        if role == "broker":
            broker_verdict(identity, data_dir)
        elif state is not None:
            sqlite_verdict(identity, state, data_dir)
        else:
            _etcd_verdict(identity, report.get("metadata_log"), data_dir)
    except MetactlError as exc:
        problem = exc
    if problem is not None:
        report["problem"] = {"code": problem.code, "message": problem.message}
        report["status"] = f"a {role} would refuse to start: {problem.code}"
    elif identity is None:
        report["status"] = (
            "not formatted: a first start adopts what it holds"
            if (state is not None and state.kind == "present") or replicas.is_dir()
            else "not formatted: a first start formats it"
        )
    else:
        report["status"] = "ok"
    return report, problem


def _etcd_verdict(identity: Identity | None, log: dict[str, Any] | None, data_dir: Path) -> None:
    if identity is None or log is None:
        return
    if identity.log_created and log["state"] == "absent":
        raise MetadataLogMissingError(
            f"no metadata log at {log['location']}, but {data_dir / IDENTITY_FILE} says it "
            "was created"
        )
    if log.get("cluster_id") not in (None, identity.cluster_id):
        raise InconsistentClusterIdError(
            f"{log['location']} holds the metadata log of cluster {log['cluster_id']!r}, but "
            f"{data_dir} belongs to cluster {identity.cluster_id!r}"
        )


def cmd_info(args: argparse.Namespace) -> int:
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
