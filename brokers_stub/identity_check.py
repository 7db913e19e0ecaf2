"""A broker's storage check at start-up: its data directory's identity
(`metadata_log.identity`, ``meta.properties``) against what the directory holds.

`check_broker_storage` runs before the broker reads its clean-shutdown file or any
replica (`brokers_stub.cli.run`), and refuses, with a named error and exit 1:

* another cluster's directory: ``--cluster-id`` differs from the identity's
  (INCONSISTENT_CLUSTER_ID);
* another broker's directory: ``--id`` differs from the identity's node id
  (INCONSISTENT_NODE_ID), or a controller's (INVALID_STORAGE_IDENTITY);
* a replica directory that is missing although the identity says it was created, and a
  replica file that is empty (0 bytes) although the last shutdown was clean
  (REPLICA_DATA_MISSING). Either way the broker would otherwise claim, under KIP-966's
  clean-shutdown rule, data it no longer has. An empty replica file after an unclean
  shutdown (an OS crash before the page cache reached the disk) is left to the replica
  manager, which ignores it, and the broker registers unclean.

A directory without identity (new, or from an earlier version) is formatted or adopted:
its identity is written with this broker's id and ``--cluster-id`` (if given: a broker
not told its cluster records the first id it is given). The replica directory is created
and the identity then says ``log.created=true``.

This module only checks and records; what the replicas hold is the replica manager's.
"""

from __future__ import annotations

from pathlib import Path

from brokers_stub.storage import CLEAN_SHUTDOWN_FILE, REPLICAS_DIR, TMP_SUFFIX, fsync_dir
from metactl.errors import ReplicaDataMissingError
from metadata_log.identity import (
    BROKER,
    IDENTITY_FILE,
    Identity,
    check,
    locked,
    read_identity,
    valid_id,
    write_identity,
)

__all__ = ["broker_verdict", "check_broker_storage"]


def check_broker_storage(data_dir: Path, *, broker_id: int, cluster_id: str | None) -> Identity:
    """Check (and complete) the broker's directory; its identity."""
    node_id = str(broker_id)
    if cluster_id is not None:
        valid_id(cluster_id, "--cluster-id")
    with locked(data_dir):
        identity = read_identity(data_dir)
        broker_verdict(identity, data_dir, cluster_id=cluster_id, node_id=node_id)
        replicas = data_dir / REPLICAS_DIR
        if not replicas.is_dir():
            replicas.mkdir()
            fsync_dir(data_dir)
        base = identity if identity is not None else Identity.new(cluster_id, node_id)
        updated = base.claimed(
            cluster_id=cluster_id, node_id=node_id, role=BROKER, log_created=True
        )
        if updated != identity:
            write_identity(data_dir, updated)
    return updated


def broker_verdict(
    identity: Identity | None,
    data_dir: Path,
    *,
    cluster_id: str | None = None,
    node_id: str | None = None,
) -> None:
    """Refuse what a broker must not start on (see the module's docstring); return if it
    may (formatting or adopting the directory)."""
    replicas = data_dir / REPLICAS_DIR
    if identity is not None:
        check(identity, data_dir, cluster_id=cluster_id, node_id=node_id, role=BROKER)
        if identity.log_created and not replicas.is_dir():
            raise ReplicaDataMissingError(
                f"the replica directory {replicas} is missing, but "
                f"{data_dir / IDENTITY_FILE} says it was created: this broker's data is "
                "lost. Restore it; to start the broker without its data on purpose (it "
                f"then registers as after a crash), delete {data_dir / CLEAN_SHUTDOWN_FILE} "
                f"if present and create the empty directory {replicas}"
            )
    refuse_emptied_replicas(data_dir, replicas)


def refuse_emptied_replicas(data_dir: Path, replicas: Path) -> None:
    """A replica file of 0 bytes is impossible after a clean shutdown (every replica is
    fsynced before the clean-shutdown file is written): something outside the broker
    truncated it."""
    clean = data_dir / CLEAN_SHUTDOWN_FILE
    if not clean.is_file() or not replicas.is_dir():
        return
    emptied = sorted(
        p.name
        for p in replicas.glob("*.json")
        if not p.name.startswith(".") and not p.name.endswith(TMP_SUFFIX) and p.stat().st_size == 0
    )
    if emptied:
        raise ReplicaDataMissingError(
            f"replica file(s) {', '.join(emptied)} in {replicas} are empty (0 bytes), but "
            f"{clean} says the last shutdown was clean, when every replica was on disk: "
            "their data was lost outside the broker, which would otherwise register as "
            "clean and claim it. Restore the files; to start without them on purpose, "
            f"delete them and {clean}"
        )
