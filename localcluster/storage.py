"""The nodes' data directories on this machine: formatted as `kafka-storage format`
formats them, and the one cluster id a local cluster's directories agree on.

`format_directories` writes each directory's ``meta.properties``
(`metadata_log.identity`), one cluster id for all of them or none: a formatted one is
STORAGE_ALREADY_FORMATTED (left as it is with ``ignore_formatted``), a log of another
cluster INCONSISTENT_CLUSTER_ID; a directory that holds a metadata log or replicas from
an earlier version is formatted as holding them (``log.created=true``). `metactl storage
format` calls it for the directories it is given; `format_cluster` for every controller's
and broker's directory of `cluster up` on a first start, with the id the directories
already record, else the metadata log's (`etcd_log_info` for a log on etcd), else a new
random one, and refuses a controller directory wiped while its brokers ran. `inspect`
is `metactl storage info`: what a directory holds and the refusal a start would meet.

The file and its checks are `metadata_log.identity`, `metadata_log.identity_check` and
`brokers_stub.storage`'s layout; this module decides what to write, and prints nothing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brokers_stub.storage import REPLICAS_DIR
from localcluster.etcd import LocalEtcd
from metactl.errors import (
    InconsistentClusterIdError,
    LogDirNotFoundError,
    MetactlError,
    MetadataLogMissingError,
    StorageAlreadyFormattedError,
)
from metadata_log.etcd.tls import PROCESS_DEFAULT, EtcdTls, ProcessDefault
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
from metadata_log.sqlite_format import LOG_FILE_NAME
from protocol.tls import ADMIN

__all__ = ["Formatted", "etcd_log_info", "format_cluster", "format_directories", "inspect"]


@dataclass(frozen=True)
class Formatted:
    data_dir: Path
    identity: Identity
    written: bool  # False: it was formatted already and left as it is
    holds: str  # what it holds: "nothing yet", "a metadata log (N bytes)", "replicas"


def _holds(data_dir: Path, log: SqliteLogState) -> str | None:
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


async def etcd_log_info(
    url: str, *, tls: EtcdTls | ProcessDefault | None = PROCESS_DEFAULT
) -> dict[str, Any]:
    """An etcd log's location, state (absent, present) and cluster id; read only. `tls`:
    TLS to etcd (default: the process's, from the command's --etcd-* flags)."""
    from metadata_log.etcd.client import Etcd
    from metadata_log.etcd.layout import Keys, open_meta
    from metadata_log.etcd.target import EtcdTarget

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


def _log_report(state: SqliteLogState) -> dict[str, Any]:
    out: dict[str, Any] = {"location": str(state.path), "state": state.kind}
    if state.kind != "absent":
        out["bytes"] = state.size
    if state.why:
        out["why"] = state.why
    if state.cluster_id is not None:
        out["cluster_id"] = state.cluster_id
    return out


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


def format_cluster(
    data: Path, controllers: list[Path], brokers: dict[int, Path], etcd: LocalEtcd | None
) -> tuple[str, list[str]]:
    """The cluster's id and the directories formatted now, with every controller's and
    broker's directory formatted (`format_directories`) on a first start: the id the
    directories already record, else the metadata log's (a cluster from before storage
    identities), else a new random one. Directories of several clusters are
    INCONSISTENT_CLUSTER_ID. Controllers on an etcd log get node ids c1, c2, ...; a
    broker, its id."""
    recorded: dict[str, list[str]] = {}
    for d in [*controllers, *brokers.values()]:
        identity = read_identity(d)
        if identity is not None and identity.cluster_id is not None:
            recorded.setdefault(identity.cluster_id, []).append(d.name)
    if len(recorded) > 1:
        raise InconsistentClusterIdError(
            f"the directories in {data} belong to several clusters: "
            + "; ".join(f"{c!r}: {', '.join(ds)}" for c, ds in sorted(recorded.items()))
        )
    cluster_id = next(iter(recorded), None) or _log_cluster_id(controllers[0], etcd)
    if recorded and etcd is None:
        _refuse_a_lost_controller_log(controllers[0], brokers, cluster_id)
    formatted: list[str] = []
    for i, d in enumerate(controllers):
        node = f"c{i + 1}" if etcd is not None else None
        done = format_directories([d], cluster_id=cluster_id, node_id=node, ignore_formatted=True)
        cluster_id = done[0].identity.cluster_id
        formatted += [f.data_dir.name for f in done if f.written]
    assert cluster_id is not None
    for b, d in brokers.items():
        done = format_directories([d], cluster_id=cluster_id, node_id=str(b), ignore_formatted=True)
        formatted += [f.data_dir.name for f in done if f.written]
    return cluster_id, formatted


def _refuse_a_lost_controller_log(
    controller: Path, brokers: dict[int, Path], cluster_id: str | None
) -> None:
    """The controller's directory empty (no identity, no log) while brokers ran in this
    cluster: its metadata log is lost (a wiped directory), and formatting it anew would
    give the brokers an empty cluster under the old id. Refused, as Kafka refuses an
    unformatted directory; `storage format` does it on purpose."""
    if read_identity(controller) is not None:
        return
    if inspect_sqlite_log(controller / LOG_FILE_NAME).kind != "absent":
        return
    ran = [
        d.name
        for d in brokers.values()
        if (identity := read_identity(d)) is not None and identity.log_created
    ]
    if ran:
        raise MetadataLogMissingError(
            f"{controller} holds no metadata log and no {IDENTITY_FILE}, but "
            f"{', '.join(ran)} ran in cluster {cluster_id!r}: the cluster's metadata "
            f"is lost. Restore {controller}; to start an empty cluster for these "
            f"brokers on purpose, run `metactl storage format --data-dir {controller} "
            f"--cluster-id {cluster_id}` first"
        )


def _log_cluster_id(controller: Path, etcd: LocalEtcd | None) -> str | None:
    """The cluster id the metadata log records, if it exists and records one."""
    if etcd is not None:
        url, tls = etcd.url("metactl"), etcd.client_tls(ADMIN)
        return asyncio.run(etcd_log_info(url, tls=tls)).get("cluster_id")
    return inspect_sqlite_log(controller / LOG_FILE_NAME).cluster_id
