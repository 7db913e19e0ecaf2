"""Storage identity at start-up (issue 21 item 6), as real processes on real files: a
controller (`metactl controller serve`) and a broker (`python -m brokers_stub`, `metactl
broker run`) refuse each case by name, exit 1, print no traceback and say nothing is
ready:

* an unformatted directory holding what cannot be adopted (an empty log file; a replica
  emptied after a clean shutdown);
* another cluster's directory (or, for the broker, another broker's or a controller's);
* a metadata log truncated to 0 bytes (the planted bug: it used to start an empty
  cluster) or deleted while the identity says it was created; a broker's replica
  directory deleted, or a replica file truncated after a clean shutdown;
* on etcd: another cluster's log, and a wiped prefix once the log was created.

And nobody's existing cluster stops starting: a log written before identities existed is
adopted with its records, and a broker directory from before identities too, its clean
shutdown honoured.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from brokers_stub.storage import CLEAN_SHUTDOWN_FILE, REPLICAS_DIR
from localcluster.etcd import LocalEtcd
from metadata_log.etcd.store import EtcdLogStore
from metadata_log.identity import IDENTITY_FILE, Identity, read_identity, write_identity
from metadata_log.sqlite_format import LOG_FILE_NAME
from metadata_log.sqlite_store import SqliteLogStore
from protocol.messages.admin import CreateTopic, CreateTopicsRequest, CreateTopicsResponse
from tests.e2e.cluster import Cluster, Process
from tests.service.test_serve_startup import metactl, write_log

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXIT_BOUND_S = 60  # bounds a hung child (a failure), not the speed of a healthy one


def refused(cmd: list[str], code: str) -> str:
    """Run `cmd` to its exit; assert status 1, no READY, no traceback and exactly one
    `error: CODE:` line on stderr, which is returned."""
    r = subprocess.run(
        cmd, capture_output=True, text=True, cwd=REPO, timeout=EXIT_BOUND_S, check=False
    )
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "READY" not in r.stdout
    assert "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {code}: "), r.stderr
    return errors[0]


def serve_cmd(data_dir: Path, *extra: str) -> list[str]:
    return [*metactl(), "controller", "serve", "--data-dir", str(data_dir),
            "--listen", "127.0.0.1:0", "--insecure", *extra]  # fmt: skip


def broker_cmd(
    data_dir: Path, broker_id: int = 1, *extra: str, controller: str = "127.0.0.1:1"
) -> list[str]:
    """A broker (by default of a controller never reached: a refusal comes before it
    asks)."""
    return [sys.executable, "-m", "brokers_stub", "--id", str(broker_id), "--controller",
            controller, "--data-dir", str(data_dir), "--insecure", *extra]  # fmt: skip


def serve_once(data_dir: Path, *extra: str) -> str:
    """Start a controller, await READY, stop it cleanly; its READY line."""
    proc = subprocess.Popen(
        serve_cmd(data_dir, *extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=REPO,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY controller listen="), (line, proc.stderr)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=EXIT_BOUND_S)
    assert proc.returncode == 0
    return line


async def end_offset(data_dir: Path) -> int:
    store = await SqliteLogStore.open(data_dir, read_only=True)
    try:
        return store.end_offset
    finally:
        await store.close()


# --- the controller ----------------------------------------------------------------------


def test_a_controller_refuses_a_truncated_or_deleted_log_and_another_cluster(
    tmp_path: Path,
) -> None:
    serve_once(tmp_path)  # a new directory: formatted, the log created and bootstrapped
    identity = read_identity(tmp_path)
    assert identity is not None and identity.log_created and identity.cluster_id is not None
    assert asyncio.run(end_offset(tmp_path)) > 0
    log = tmp_path / LOG_FILE_NAME

    # The planted bug: `truncate -s 0` used to start an empty cluster at offset 0.
    subprocess.run(["truncate", "-s", "0", str(log)], check=True)
    line = refused(serve_cmd(tmp_path), "METADATA_LOG_MISSING")
    assert f"{log} is empty (0 bytes)" in line and "says it was created" in line
    assert log.stat().st_size == 0  # refused before anything wrote to it

    log.unlink()
    line = refused(serve_cmd(tmp_path), "METADATA_LOG_MISSING")
    assert f"{log} is missing" in line
    assert not log.exists()

    line = refused(serve_cmd(tmp_path, "--cluster-id", "another"), "INCONSISTENT_CLUSTER_ID")
    assert f"belongs to cluster {identity.cluster_id!r}" in line and "not to 'another'" in line

    # An unformatted directory holding an empty log: not adopted (it may be a truncated one).
    (tmp_path / IDENTITY_FILE).unlink()
    log.write_bytes(b"")
    line = refused(serve_cmd(tmp_path), "STORAGE_NOT_FORMATTED")
    assert "a truncated log cannot be adopted" in line and "metactl storage format" in line


def test_a_log_from_before_identities_is_adopted_with_its_records(tmp_path: Path) -> None:
    asyncio.run(write_log(tmp_path, brokers=10))
    before = asyncio.run(end_offset(tmp_path))
    assert before == 10 and not (tmp_path / IDENTITY_FILE).exists()
    serve_once(tmp_path, "--cluster-id", "adopted")
    identity = read_identity(tmp_path)
    assert identity is not None
    assert (identity.cluster_id, identity.log_created, identity.role) == (
        "adopted", True, "controller",
    )  # fmt: skip
    assert asyncio.run(end_offset(tmp_path)) >= before  # kept, and served on from there
    # It starts again as any formatted directory does, and `storage info` says it is fine.
    serve_once(tmp_path)
    r = subprocess.run(
        [*metactl(), "storage", "info", "--data-dir", str(tmp_path), "--json"],
        capture_output=True, text=True, cwd=REPO, timeout=EXIT_BOUND_S, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["status"] == "ok" and info["metadata_log"]["cluster_id"] == "adopted"


# --- the controller on etcd ----------------------------------------------------------------


def test_a_controller_on_etcd_refuses_another_clusters_log_and_a_wiped_prefix(
    tmp_path: Path, etcd: LocalEtcd
) -> None:
    url = etcd.url(f"identity-proc/{uuid.uuid4().hex[:10]}")

    async def create(cluster_id: str) -> None:
        store = await EtcdLogStore.open(url, cluster_id=cluster_id)
        await store.close()

    asyncio.run(create("cluster-b"))
    write_identity(tmp_path / "a", Identity.new("cluster-a"))
    line = refused(serve_cmd(tmp_path / "a", "--metadata-log", url), "INCONSISTENT_CLUSTER_ID")
    assert "cluster 'cluster-b', not of 'cluster-a'" in line

    # A directory whose identity says the log was created, pointed at an empty prefix (a
    # wiped one, or another etcd): refused, and nothing is created there.
    empty = etcd.url(f"identity-proc/{uuid.uuid4().hex[:10]}")
    write_identity(tmp_path / "b", Identity(cluster_id="c", directory_id="d", log_created=True))
    line = refused(serve_cmd(tmp_path / "b", "--metadata-log", empty), "METADATA_LOG_MISSING")
    assert "the prefix is empty" in line

    async def absent() -> bool:
        try:
            await EtcdLogStore.open(empty, read_only=True)
        except Exception as exc:
            return "no metadata log" in str(exc)
        return False

    assert asyncio.run(absent())


# --- the broker ----------------------------------------------------------------------------


def test_a_broker_refuses_another_cluster_another_node_and_a_controllers_directory(
    tmp_path: Path,
) -> None:
    d = tmp_path / "b1"
    r = subprocess.run(
        [*metactl(), "storage", "format", "--data-dir", str(d), "--cluster-id", "cluster-a",
         "--node-id", "1"],
        capture_output=True, text=True, cwd=REPO, timeout=EXIT_BOUND_S, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    line = refused(broker_cmd(d, 1, "--cluster-id", "cluster-b"), "INCONSISTENT_CLUSTER_ID")
    assert "belongs to cluster 'cluster-a'" in line and "not to 'cluster-b'" in line
    line = refused(broker_cmd(d, 2), "INCONSISTENT_NODE_ID")
    assert "belongs to node '1'" in line and "not to '2'" in line
    identity = read_identity(d)
    assert identity is not None and not identity.log_created  # refusals write nothing

    c = tmp_path / "controller"
    write_identity(c, Identity(cluster_id="x", directory_id="d", role="controller"))
    line = refused(
        [*metactl(), "broker", "run", "--id", "1", "--controller", "127.0.0.1:1",
         "--data-dir", str(c), "--insecure"],
        "INVALID_STORAGE_IDENTITY",
    )  # fmt: skip
    assert "is a controller's data directory" in line


def test_a_broker_refuses_damaged_data_even_unformatted(tmp_path: Path) -> None:
    """Replicas emptied behind a clean shutdown, in a directory without identity (one of
    an earlier version): not adopted, since the broker would register as clean."""
    d = tmp_path / "old"
    (d / REPLICAS_DIR).mkdir(parents=True)
    (d / REPLICAS_DIR / "t-0.json").write_bytes(b"")
    (d / CLEAN_SHUTDOWN_FILE).write_text('{"broker_epoch": 7}\n')
    line = refused(broker_cmd(d), "REPLICA_DATA_MISSING")
    assert "t-0.json" in line and "the last shutdown was clean" in line
    assert (d / CLEAN_SHUTDOWN_FILE).exists()  # the refusal took nothing away
    assert not (d / IDENTITY_FILE).exists()


async def create_topic(cluster: Cluster, name: str) -> None:
    r = await cluster.request(
        CreateTopicsRequest(topics=[CreateTopic(name=name, partitions=2, replication_factor=1)])
    )
    assert isinstance(r, CreateTopicsResponse) and not r.results[0].error_code, r


def test_a_broker_refuses_its_truncated_or_deleted_replicas_and_adopts_an_old_directory(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path, tls=False)
    d = tmp_path / "broker-1"
    try:
        cluster.start_controller()
        broker = cluster.start_broker(1)
        identity = read_identity(d)
        assert identity is not None and identity.log_created and identity.node_id == "1"
        asyncio.run(cluster.wait_until(lambda s: not s.brokers[0].fenced, "broker 1 unfenced"))
        first_epoch = int(broker.field("epoch"))
        asyncio.run(create_topic(cluster, "t"))
        asyncio.run(cluster.wait_for(lambda: cluster.replica(1, "t", 1), "broker 1's replica"))
        cluster.brokers.pop(1)
        broker.signal(signal.SIGTERM)
        assert broker.wait() == 0
        broker.close()
        assert (d / CLEAN_SHUTDOWN_FILE).exists()

        # A replica file truncated behind the clean shutdown.
        replica = d / REPLICAS_DIR / "t-1.json"
        saved = replica.read_bytes()
        subprocess.run(["truncate", "-s", "0", str(replica)], check=True)
        line = refused(broker_cmd(d), "REPLICA_DATA_MISSING")
        assert "t-1.json" in line and "the last shutdown was clean" in line
        replica.write_bytes(saved)

        # The whole replica directory deleted.
        (d / REPLICAS_DIR).rename(tmp_path / "moved-away")
        line = refused(broker_cmd(d), "REPLICA_DATA_MISSING")
        assert f"{d / REPLICAS_DIR} is missing" in line
        (tmp_path / "moved-away").rename(d / REPLICAS_DIR)

        # A directory as an earlier version left it: no identity. It is adopted, and its
        # clean shutdown still counts (the registration is clean).
        (d / IDENTITY_FILE).unlink()
        again = Process(
            "broker-1",
            broker_cmd(d, controller=cluster.address),
            tmp_path / "logs" / "broker-1-again.log",
        )
        cluster.brokers[1] = again
        again.await_ready()
        identity = read_identity(d)
        assert identity is not None and identity.log_created and identity.node_id == "1"
        assert int(again.field("epoch")) > first_epoch
        described = asyncio.run(cluster.describe())
        [b1] = [b for b in described.brokers if b.broker_id == 1]
        assert b1.last_registration_clean
    finally:
        cluster.stop()
