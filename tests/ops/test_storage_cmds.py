"""`metactl storage format|info|random-uuid` (issue 21 item 6), on real directories, and
`metactl cluster up` formatting its directories on a first start.

format: a random cluster id by default, printed; the given one otherwise; a formatted
directory is STORAGE_ALREADY_FORMATTED (exit 1) unless --ignore-formatted, which leaves
it as it is; nothing is written unless every directory can be; a directory holding a log
of an earlier version is formatted as holding it, with the log's cluster id. info: the
identity and what the directory holds, exit 0 where a process would start, the named
refusal and exit 1 where it would not, 4 for no directory.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from brokers_stub.storage import CLEAN_SHUTDOWN_FILE, REPLICAS_DIR
from localcluster.etcd import LocalEtcd
from metadata_log.identity import IDENTITY_FILE, Identity, read_identity, write_identity
from metadata_log.identity_check import check_storage
from metadata_log.sqlite_format import LOG_FILE_NAME
from metadata_log.sqlite_store import SqliteLogStore
from ops.cli import main
from tests.e2e.cluster import free_port
from tests.metadata_log.log_fixtures import records

REPO = Path(__file__).resolve().parents[2]


def storage(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["storage", *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_format_prints_a_random_cluster_id_and_refuses_to_format_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "new" / "controller"
    status, out, err = storage(capsys, "format", "--data-dir", str(d))
    assert status == 0, err
    first, second = out.splitlines()
    assert first.startswith("cluster.id: ")
    cluster_id = first.removeprefix("cluster.id: ")
    identity = read_identity(d)
    assert identity is not None
    assert (identity.cluster_id, identity.log_created, identity.role) == (cluster_id, False, None)
    assert second == f"{d}: formatted (directory.id {identity.directory_id}, holding nothing yet)"
    before = (d / IDENTITY_FILE).read_bytes()

    status, out, err = storage(capsys, "format", "--data-dir", str(d), "--cluster-id", "x")
    assert status == 1 and out == ""
    assert err.startswith(f"error: STORAGE_ALREADY_FORMATTED: {d} is already formatted")
    assert err.count("\n") == 1 and "--ignore-formatted" in err

    status, out, err = storage(capsys, "format", "--data-dir", str(d), "--ignore-formatted")
    assert (
        status == 0 and out == f"{d}: already formatted (cluster.id {cluster_id}); left as it is\n"
    )
    assert (d / IDENTITY_FILE).read_bytes() == before  # left as it was

    status, out, _ = storage(capsys, "format", "--data-dir", str(tmp_path / "other"))
    assert status == 0 and out.splitlines()[0] != first  # another random id


def test_format_several_directories_all_or_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b, c = (tmp_path / n for n in "abc")
    write_identity(c, Identity.new("old"))
    status, _, err = storage(
        capsys, "format", "--data-dir", str(a), "--data-dir", str(b), "--data-dir", str(c),
        "--cluster-id", "prod", "--node-id", "1",
    )  # fmt: skip
    assert status == 1 and "STORAGE_ALREADY_FORMATTED" in err
    assert read_identity(a) is None and read_identity(b) is None  # nothing written

    status, out, err = storage(
        capsys, "format", "--data-dir", str(a), "--data-dir", str(b), "--cluster-id", "prod",
        "--node-id", "1",
    )  # fmt: skip
    assert status == 0, err
    ids = [read_identity(x) for x in (a, b)]
    assert [(i.cluster_id, i.node_id) for i in ids if i is not None] == [("prod", "1")] * 2
    assert ids[0] is not None and ids[1] is not None
    assert ids[0].directory_id != ids[1].directory_id
    assert out.splitlines()[0] == "cluster.id: prod" and "node.id 1," in out


@pytest.mark.parametrize("bad", ["a=b", "", " a", "a\tb"])
def test_an_id_that_cannot_be_written_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    status, out, err = storage(capsys, "format", "--data-dir", str(tmp_path), "--cluster-id", bad)
    assert status == 2 and out == "" and err.startswith("error: INVALID_CONFIG: --cluster-id")
    assert not (tmp_path / IDENTITY_FILE).exists()


async def write_log(data_dir: Path, n: int) -> None:
    store = await SqliteLogStore.open(data_dir)
    try:
        await store.append(records(n))
    finally:
        await store.close()


def test_format_of_a_directory_from_an_earlier_version_records_its_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(write_log(tmp_path / "old", 5))
    status, out, err = storage(capsys, "format", "--data-dir", str(tmp_path / "old"))
    assert status == 0, err
    identity = read_identity(tmp_path / "old")
    assert identity is not None and identity.log_created
    assert "holding a metadata log (" in out

    # A log that records its cluster (its identity lost): formatted with that id only.
    asyncio.run(check_storage(tmp_path / "rec", None, cluster_id="recorded"))
    (tmp_path / "rec" / IDENTITY_FILE).unlink()
    status, _, err = storage(
        capsys, "format", "--data-dir", str(tmp_path / "rec"), "--cluster-id", "other"
    )
    assert status == 1 and err.startswith("error: INCONSISTENT_CLUSTER_ID: ")
    status, out, _ = storage(capsys, "format", "--data-dir", str(tmp_path / "rec"))
    assert status == 0 and out.startswith("cluster.id: recorded\n")

    # A broker's directory of an earlier version: formatted as holding its replicas.
    (tmp_path / "b" / REPLICAS_DIR).mkdir(parents=True)
    status, out, _ = storage(capsys, "format", "--data-dir", str(tmp_path / "b"), "--node-id", "3")
    identity = read_identity(tmp_path / "b")
    assert status == 0 and identity is not None and identity.log_created
    assert "holding replicas" in out


def info(capsys: pytest.CaptureFixture[str], d: Path, *extra: str) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    status, out, err = storage(capsys, "info", "--data-dir", str(d), "--json", *extra)
    return status, json.loads(out), err


def test_info_says_whether_a_process_would_start_and_why_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "c"
    d.mkdir()
    status, report, _ = info(capsys, d)
    assert status == 0 and report["identity"] is None
    assert report["status"] == "not formatted: a first start formats it"

    asyncio.run(check_storage(d, None, cluster_id="k"))  # a controller's first start
    capsys.readouterr()  # its log lines
    status, report, _ = info(capsys, d)
    assert status == 0 and report["status"] == "ok" and report["role"] == "controller"
    assert report["identity"]["cluster.id"] == "k"
    assert report["identity"]["metadata.log"] == str((d / LOG_FILE_NAME).absolute())
    assert report["metadata_log"]["state"] == "present"
    assert report["metadata_log"]["cluster_id"] == "k"

    status, out, _ = storage(capsys, "info", "--data-dir", str(d))
    assert status == 0
    assert out.splitlines()[:2] == [f"data directory: {d}", f"identity: {d / IDENTITY_FILE}"]
    assert "  cluster.id=k" in out.splitlines() and out.endswith("status: ok\n")

    (d / LOG_FILE_NAME).write_bytes(b"")  # truncated
    status, report, err = info(capsys, d)
    assert status == 1 and report["problem"]["code"] == "METADATA_LOG_MISSING"
    assert report["status"] == "a controller would refuse to start: METADATA_LOG_MISSING"
    assert err.startswith("error: METADATA_LOG_MISSING: ") and err.count("\n") == 1

    (d / IDENTITY_FILE).unlink()
    status, report, err = info(capsys, d)
    assert status == 1 and err.startswith("error: STORAGE_NOT_FORMATTED: ")

    status, _, err = storage(capsys, "info", "--data-dir", str(tmp_path / "none"))
    assert status == 4 and err.startswith("error: LOG_DIR_NOT_FOUND: no directory ")


def test_info_on_a_broker_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "b"
    write_identity(
        d, Identity(cluster_id="k", directory_id="x", node_id="1", role="broker", log_created=True)
    )
    status, report, err = info(capsys, d)
    assert status == 1 and report["role"] == "broker" and "metadata_log" not in report
    assert err.startswith("error: REPLICA_DATA_MISSING: the replica directory ")

    (d / REPLICAS_DIR).mkdir()
    (d / REPLICAS_DIR / "t-0.json").write_bytes(b"")
    status, report, _ = info(capsys, d)
    assert status == 0 and report["replicas"] == {
        "location": str(d / REPLICAS_DIR), "files": 1, "clean_shutdown": False,
    }  # fmt: skip
    (d / CLEAN_SHUTDOWN_FILE).write_text('{"broker_epoch": 3}\n')
    status, report, err = info(capsys, d)
    assert status == 1 and "t-0.json" in report["problem"]["message"]


def test_info_on_an_etcd_controllers_directory_reads_the_recorded_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], etcd: LocalEtcd
) -> None:
    url = etcd.url(f"storage-info/{uuid.uuid4().hex[:10]}")
    asyncio.run(check_storage(tmp_path, url, cluster_id="on-etcd"))
    capsys.readouterr()  # its log lines
    status, report, _ = info(capsys, tmp_path)  # no --metadata-log: the recorded one
    assert status == 0 and report["status"] == "ok"
    assert report["metadata_log"] == {"location": url, "state": "present", "cluster_id": "on-etcd"}
    other = etcd.url(f"storage-info/{uuid.uuid4().hex[:10]}")  # an empty prefix
    status, report, err = info(capsys, tmp_path, "--metadata-log", other)
    assert status == 1 and report["metadata_log"]["state"] == "absent"
    assert err.startswith(f"error: METADATA_LOG_MISSING: no metadata log at {other}")


def test_random_uuid_and_no_traceback_from_the_real_command(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "ops.cli", "storage", "random-uuid"],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 0 and len(r.stdout.strip()) == 22
    (tmp_path / IDENTITY_FILE).write_text("version=9\ndirectory.id=x\n")
    r = subprocess.run(
        [sys.executable, "-m", "ops.cli", "storage", "info", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("error: INVALID_STORAGE_IDENTITY: ") and "version '9'" in r.stderr


def log_row(path: Path) -> str | None:
    with sqlite3.connect(path) as db:
        row = db.execute("SELECT value FROM meta WHERE key = 'cluster_id'").fetchone()
    return None if row is None else str(row[0])


def cluster_up(data: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", "cluster", "up", "--data-dir", str(data),
         "--insecure", "--brokers", "2", "--listen", f"127.0.0.1:{free_port()}",
         "--metrics", "127.0.0.1:0", "--kafka-base-port", "0", "--partitions", "1",
         "--min-isr", "1", "--exit-after-ready"],
        capture_output=True, text=True, cwd=REPO, timeout=180, check=False,
    )  # fmt: skip


def storage_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, r.stderr
    [line] = [x for x in r.stdout.splitlines() if x.startswith("  storage:")]
    return line


@pytest.mark.slow
def test_cluster_up_formats_on_the_first_start_and_keeps_the_id(tmp_path: Path) -> None:
    data = tmp_path / "data"
    line = storage_line(cluster_up(data))
    assert "; formatted controller, broker-1, broker-2  (metactl storage info" in line
    cluster_id = line.split()[2].rstrip(";")
    for d in ("controller", "broker-1", "broker-2"):
        identity = read_identity(data / d)
        assert identity is not None and identity.cluster_id == cluster_id and identity.log_created
    assert log_row(data / "controller" / LOG_FILE_NAME) == cluster_id

    line = storage_line(cluster_up(data))  # a second run: the same cluster, nothing formatted
    assert line.split()[:3] == ["storage:", "cluster.id", cluster_id] and "formatted" not in line

    # The controller's directory wiped, the brokers' kept: the metadata is lost, and a new
    # empty cluster under the old id is refused until the operator formats it on purpose.
    shutil.rmtree(data / "controller")
    r = cluster_up(data)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("error: METADATA_LOG_MISSING: ") and "broker-1, broker-2" in r.stderr
    assert read_identity(data / "controller") is None
    status = main(["storage", "format", "--data-dir", str(data / "controller"),
                   "--cluster-id", cluster_id])  # fmt: skip
    assert status == 0
    r = cluster_up(data)
    assert "topic demo created" in r.stdout, r.stderr  # an empty cluster, deliberately

    # A broker directory of another cluster is refused before anything starts.
    write_identity(data / "broker-2", Identity(cluster_id="foreign", directory_id="x"))
    r = cluster_up(data)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("error: INCONSISTENT_CLUSTER_ID: the directories in ")
    assert "'foreign': broker-2" in r.stderr


@pytest.mark.slow
def test_cluster_up_adopts_a_data_directory_from_before_identities(tmp_path: Path) -> None:
    data = tmp_path / "data"
    storage_line(cluster_up(data))
    # As an earlier version left it: no identities, no cluster id in the log.
    for d in ("controller", "broker-1", "broker-2"):
        (data / d / IDENTITY_FILE).unlink()
    with sqlite3.connect(data / "controller" / LOG_FILE_NAME) as db:
        db.execute("DELETE FROM meta WHERE key = 'cluster_id'")
    line = storage_line(cluster_up(data))
    assert "; formatted controller, broker-1, broker-2" in line
    r = cluster_up(data)  # the adopted cluster kept its demo topic
    assert "topic demo kept (TOPIC_ALREADY_EXISTS)" in r.stdout, r.stderr
