"""Storage identity (issue 21 item 6): the `meta.properties` file and the controller's
start-up check of it against its log, on real files and a real etcd.

The file: what is written reads back, keys of a newer metactl are kept, a malformed file
is a named error, a write leaves no temporary file. The check: a new directory is
formatted and its log created with the cluster id; a log from before identities is
adopted (its records kept, the identity written); a log that is missing, truncated to
0 bytes or left without tables while the identity says it was created is
METADATA_LOG_MISSING (the SQLite store alone opens such a file as an empty log: the
planted bug the check catches); another cluster's log or directory is
INCONSISTENT_CLUSTER_ID; the etcd log's `LogMeta` is held to the same identity.
"""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest

from localcluster.etcd import LocalEtcd
from metactl.errors import (
    InconsistentClusterIdError,
    InconsistentNodeIdError,
    InvalidConfigurationError,
    LogSchemaError,
    MetadataLogMissingError,
    StorageIdentityError,
    StorageNotFormattedError,
)
from metadata_log.backends import open_store
from metadata_log.etcd.client import Etcd
from metadata_log.etcd.store import EtcdLogStore
from metadata_log.etcd.target import EtcdTarget, prefix_end
from metadata_log.etcd.txn import op_delete
from metadata_log.identity import (
    BROKER,
    CONTROLLER,
    IDENTITY_FILE,
    Identity,
    check,
    read_identity,
    valid_id,
    write_identity,
)
from metadata_log.identity_check import check_storage, inspect_sqlite_log
from metadata_log.sqlite_format import LOG_FILE_NAME
from metadata_log.sqlite_store import SqliteLogStore
from tests.metadata_log.log_fixtures import records

# --- the file --------------------------------------------------------------------------


def test_an_identity_reads_back_as_written_and_keeps_unknown_keys(tmp_path: Path) -> None:
    identity = Identity(
        cluster_id="c-1",
        directory_id="d-1",
        node_id="3",
        role=BROKER,
        log_created=True,
        log_location="etcd://127.0.0.1:2379/metactl",
        extra=(("future.key", "x=y"),),
    )
    write_identity(tmp_path, identity)
    assert read_identity(tmp_path) == identity
    text = (tmp_path / IDENTITY_FILE).read_text()
    assert "version=1\ncluster.id=c-1\ndirectory.id=d-1\nnode.id=3\n" in text
    assert "process.role=broker\nlog.created=true\n" in text
    assert "metadata.log=etcd://127.0.0.1:2379/metactl\nfuture.key=x=y\n" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == [IDENTITY_FILE]  # no temporary left

    write_identity(tmp_path, Identity.new("c-2"))  # replaced whole
    again = read_identity(tmp_path)
    assert again is not None and again.cluster_id == "c-2" and not again.log_created
    assert again.role is None and again.node_id is None and len(again.directory_id) == 22
    assert read_identity(tmp_path / "absent") is None


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("version=1\ndirectory.id=d\nno equals sign\n", "is not key=value"),
        ("version=1\nversion=1\ndirectory.id=d\n", "sets version twice"),
        ("version=2\ndirectory.id=d\n", "version '2'; this metactl reads version 1"),
        ("cluster.id=c\ndirectory.id=d\n", "version None"),
        ("version=1\ncluster.id=c\n", "no directory.id"),
        ("version=1\ndirectory.id=d\nprocess.role=admin\n", "process.role 'admin'"),
        ("version=1\ndirectory.id=d\nlog.created=yes\n", "log.created 'yes'"),
    ],
)
def test_a_malformed_identity_is_a_named_error(tmp_path: Path, text: str, words: str) -> None:
    (tmp_path / IDENTITY_FILE).write_text(text)
    with pytest.raises(StorageIdentityError, match=words) as raised:
        read_identity(tmp_path)
    assert raised.value.code == "INVALID_STORAGE_IDENTITY"
    (tmp_path / IDENTITY_FILE).write_bytes(b"\xff\xfe")
    with pytest.raises(StorageIdentityError, match="is not text"):
        read_identity(tmp_path)


def test_check_refuses_another_cluster_node_or_role_and_claimed_fills_gaps(
    tmp_path: Path,
) -> None:
    identity = Identity(cluster_id="a", directory_id="d", node_id="1", role=BROKER)
    check(identity, tmp_path, cluster_id="a", node_id="1", role=BROKER)
    check(identity, tmp_path, cluster_id=None, node_id=None, role=BROKER)  # not told
    with pytest.raises(InconsistentClusterIdError, match="belongs to cluster 'a'"):
        check(identity, tmp_path, cluster_id="b", node_id="1", role=BROKER)
    with pytest.raises(InconsistentNodeIdError, match="belongs to node '1'"):
        check(identity, tmp_path, cluster_id="a", node_id="2", role=BROKER)
    with pytest.raises(StorageIdentityError, match="is a broker's data directory"):
        check(identity, tmp_path, cluster_id="a", node_id="1", role=CONTROLLER)

    blank = Identity(cluster_id=None, directory_id="d")
    check(blank, tmp_path, cluster_id="x", node_id="9", role=CONTROLLER)  # nothing recorded
    filled = blank.claimed(cluster_id="x", node_id="9", role=CONTROLLER, log_created=True)
    assert (filled.cluster_id, filled.node_id, filled.role, filled.log_created) == (
        "x", "9", CONTROLLER, True,
    )  # fmt: skip
    kept = filled.claimed(cluster_id="y", node_id="8", role=BROKER, log_created=False)
    assert kept == filled  # what is recorded stays; log.created is never unset


@pytest.mark.parametrize("value", ["", " a", "a b\n", "a=b", "tab\there"])
def test_ids_that_cannot_be_written_are_refused(value: str) -> None:
    with pytest.raises(InvalidConfigurationError, match="--cluster-id must be printable"):
        valid_id(value, "--cluster-id")


# --- the controller's check on a SQLite log --------------------------------------------


def log_cluster_id(path: Path) -> str | None:
    with sqlite3.connect(path) as db:
        row = db.execute("SELECT value FROM meta WHERE key = 'cluster_id'").fetchone()
    return None if row is None else str(row[0])


async def write_log(data_dir: Path, n: int) -> None:
    """A log as an earlier version wrote it: records, no identity, no cluster id."""
    store = await SqliteLogStore.open(data_dir)
    try:
        await store.append(records(n))
    finally:
        await store.close()


async def end_offset(where: Path) -> int:
    store = await open_store(where)
    try:
        return store.end_offset
    finally:
        await store.close()


async def test_a_new_directory_is_formatted_and_its_log_created_with_the_cluster_id(
    tmp_path: Path,
) -> None:
    d = tmp_path / "new"
    cluster_id = await check_storage(d, None)
    assert cluster_id is not None and len(cluster_id) == 22
    identity = read_identity(d)
    assert identity is not None
    assert (identity.cluster_id, identity.role, identity.log_created) == (
        cluster_id, CONTROLLER, True,
    )  # fmt: skip
    assert log_cluster_id(d / LOG_FILE_NAME) == cluster_id
    before = (d / IDENTITY_FILE).read_bytes()
    assert await check_storage(d, None) == cluster_id  # a restart: nothing changes
    assert (d / IDENTITY_FILE).read_bytes() == before

    named = tmp_path / "named"
    assert await check_storage(named, None, cluster_id="prod", node_id="c1") == "prod"
    identity = read_identity(named)
    assert identity is not None and identity.node_id == "c1"
    with pytest.raises(InconsistentNodeIdError):
        await check_storage(named, None, cluster_id="prod", node_id="c2")
    with pytest.raises(InvalidConfigurationError):
        await check_storage(tmp_path / "bad", None, cluster_id="a=b")


async def test_a_log_from_before_identities_is_adopted_with_its_records(tmp_path: Path) -> None:
    await write_log(tmp_path, 50)
    assert not (tmp_path / IDENTITY_FILE).exists()
    assert log_cluster_id(tmp_path / LOG_FILE_NAME) is None
    cluster_id = await check_storage(tmp_path, None, cluster_id="legacy")
    assert cluster_id == "legacy"
    identity = read_identity(tmp_path)
    assert identity is not None and identity.log_created and identity.cluster_id == "legacy"
    assert log_cluster_id(tmp_path / LOG_FILE_NAME) == "legacy"
    assert await end_offset(tmp_path) == 50  # nothing of the log was lost or rewritten

    # A directory whose identity went but whose log records its cluster: the log's id.
    (tmp_path / IDENTITY_FILE).unlink()
    assert await check_storage(tmp_path, None) == "legacy"
    (tmp_path / IDENTITY_FILE).unlink()
    with pytest.raises(InconsistentClusterIdError, match="cluster 'legacy', not of 'other'"):
        await check_storage(tmp_path, None, cluster_id="other")


async def test_a_formatted_directory_gets_its_log_on_the_first_start(tmp_path: Path) -> None:
    write_identity(tmp_path, Identity.new("fmt"))  # what `storage format` writes
    assert await check_storage(tmp_path, None) == "fmt"
    identity = read_identity(tmp_path)
    assert identity is not None and identity.log_created
    assert log_cluster_id(tmp_path / LOG_FILE_NAME) == "fmt"
    with pytest.raises(InconsistentClusterIdError, match="belongs to cluster 'fmt'"):
        await check_storage(tmp_path, None, cluster_id="other")


def truncate(path: Path) -> None:
    with path.open("r+b") as f:
        f.truncate(0)


def no_tables(path: Path) -> None:
    path.unlink()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 7")  # a database file with a header, no tables


def wal_only(path: Path) -> None:
    path.rename(path.with_name(path.name + "-wal"))


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (truncate, r"is empty \(0 bytes\)"),
        (Path.unlink, "is missing"),
        (no_tables, r"bytes holding no tables\)"),
        (wal_only, "only its write-ahead log"),
    ],
)
async def test_a_lost_log_is_refused_where_the_store_alone_would_serve_it_empty(
    tmp_path: Path, damage: object, words: str
) -> None:
    """The planted bug: a log truncated to 0 bytes (or deleted, or emptied) while the
    identity says it was created. The store alone opens it as a new, empty log; the
    check refuses it by name."""
    await check_storage(tmp_path, None, cluster_id="c")
    await write_log(tmp_path, 20)
    path = tmp_path / LOG_FILE_NAME
    damage(path)  # type: ignore[operator]
    with pytest.raises(MetadataLogMissingError, match=words) as raised:
        await check_storage(tmp_path, None, cluster_id="c")
    assert raised.value.code == "METADATA_LOG_MISSING"
    assert "says it was created" in raised.value.message
    if damage is not wal_only:
        # Without the check: an empty cluster at offset 0, and the 20 records gone.
        assert await end_offset(tmp_path) == 0
        path.unlink()
    # Without an identity either, an emptied log is not adopted.
    (tmp_path / IDENTITY_FILE).unlink()
    path.write_bytes(b"")
    with pytest.raises(StorageNotFormattedError, match="a truncated log cannot be adopted"):
        await check_storage(tmp_path, None)


async def test_another_clusters_log_in_a_directory_is_refused(tmp_path: Path) -> None:
    """A log file copied in from another cluster's directory: its cluster id says so."""
    await check_storage(tmp_path / "a", None, cluster_id="cluster-a")
    await check_storage(tmp_path / "b", None, cluster_id="cluster-b")
    (tmp_path / "b" / LOG_FILE_NAME).replace(tmp_path / "a" / LOG_FILE_NAME)
    with pytest.raises(InconsistentClusterIdError) as raised:
        await check_storage(tmp_path / "a", None)
    assert "of cluster 'cluster-b', but" in raised.value.message
    assert "belongs to cluster 'cluster-a'" in raised.value.message


async def test_a_file_that_is_no_log_is_left_to_the_store_to_name(tmp_path: Path) -> None:
    path = tmp_path / LOG_FILE_NAME
    path.write_bytes(b"not a database" * 100)
    assert inspect_sqlite_log(path).kind == "foreign"
    assert await check_storage(tmp_path, None, cluster_id="c") == "c"
    assert not (tmp_path / IDENTITY_FILE).exists()  # nothing written for it
    with pytest.raises(LogSchemaError, match="is not a metactl metadata log"):
        await open_store(tmp_path)


async def test_a_log_elsewhere_is_checked_against_the_data_directory(tmp_path: Path) -> None:
    log = f"sqlite://{tmp_path / 'logs' / 'ctl.sqlite'}"
    assert await check_storage(tmp_path / "d", log, cluster_id="x") == "x"
    assert log_cluster_id(tmp_path / "logs" / "ctl.sqlite") == "x"
    (tmp_path / "logs" / "ctl.sqlite").unlink()
    with pytest.raises(MetadataLogMissingError, match=r"ctl\.sqlite is missing"):
        await check_storage(tmp_path / "d", log)
    assert await check_storage(tmp_path / "m", "memory:", cluster_id="y") == "y"
    assert not (tmp_path / "m").exists()  # an in-memory log has no storage


# --- the controller's check on an etcd log ---------------------------------------------


@pytest.fixture
def url(etcd: LocalEtcd) -> str:
    return etcd.url(f"identity/{uuid.uuid4().hex[:10]}")


async def log_meta_cluster_id(url: str) -> str:
    store = await EtcdLogStore.open(url, read_only=True)
    try:
        return store.cluster_id
    finally:
        await store.close()


async def test_an_etcd_log_is_created_with_the_identitys_cluster_id(
    tmp_path: Path, url: str
) -> None:
    write_identity(tmp_path, Identity.new("etcd-c"))
    assert await check_storage(tmp_path, url) == "etcd-c"
    assert await log_meta_cluster_id(url) == "etcd-c"
    identity = read_identity(tmp_path)
    assert identity is not None and identity.log_created and identity.role == CONTROLLER
    # A second controller's new directory adopts the log's id.
    assert await check_storage(tmp_path / "c2", url, node_id="c2") == "etcd-c"


async def test_an_etcd_log_of_another_cluster_is_refused(tmp_path: Path, url: str) -> None:
    store = await EtcdLogStore.open(url, cluster_id="cluster-b")
    await store.close()
    write_identity(tmp_path, Identity.new("cluster-a"))
    with pytest.raises(InconsistentClusterIdError, match="cluster 'cluster-b', not of 'cluster-a'"):
        await check_storage(tmp_path, url)
    identity = read_identity(tmp_path)
    assert identity is not None and not identity.log_created  # nothing recorded


async def test_a_wiped_etcd_prefix_is_refused_once_the_log_was_created(
    tmp_path: Path, url: str
) -> None:
    assert await check_storage(tmp_path, url, cluster_id="wiped") == "wiped"
    target = EtcdTarget.parse(url)
    etcd = await Etcd.connect(target)
    try:  # someone wipes the prefix (or the controller is pointed at another etcd)
        await etcd.txn("wiping", [], [op_delete(target.prefix, prefix_end(target.prefix))])
    finally:
        await etcd.close()
    with pytest.raises(MetadataLogMissingError, match="the prefix is empty"):
        await check_storage(tmp_path, url)


def test_new_ids_never_start_with_a_dash() -> None:
    # About one in 64 random ids would: `--cluster-id -x...` reads as a flag (found when
    # cluster up passed one to a controller).
    from metadata_log.identity import new_id

    ids = [new_id() for _ in range(2000)]
    assert not any(i.startswith("-") for i in ids)
    assert len(set(ids)) == len(ids) and all(len(i) == 22 for i in ids)
