"""Every shape of a damaged `meta.properties` is INVALID_STORAGE_IDENTITY naming the file
(issue 30, item 9): for `read_identity`, the controller's start-up check, the broker's,
and `metactl storage info|format` (exit 1, one `error:` line, no traceback). A FIFO or
a device in its place must not hang a start (the file is opened without blocking and
refused as not a regular file); a directory used to escape as `[Errno 21] Is a
directory`, a dangling symbolic link used to read as no identity at all (and be
overwritten by a first start), and a FIFO used to block forever.

Unreadable by permission cannot be made for root (the tests run as root: chmod 000 does
not stop it), so that shape is an `os.open` that answers EACCES.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from brokers_stub.identity_check import check_broker_storage
from metactl.errors import StorageIdentityError
from metadata_log.identity import IDENTITY_FILE, MAX_IDENTITY_BYTES, read_identity
from metadata_log.identity_check import check_storage
from ops.cli import main

REPO = Path(__file__).resolve().parents[2]
EXIT_BOUND_S = 60  # bounds a hung child (a failure), not the speed of a healthy one
GOOD = "version=1\ncluster.id=c\ndirectory.id=d\n"
BROKER = "version=1\ncluster.id=c\ndirectory.id=d\nprocess.role=broker\n"


def text(body: str) -> Callable[[Path], None]:
    return lambda p: p.write_text(body)


def raw(body: bytes) -> Callable[[Path], None]:
    return lambda p: p.write_bytes(body)


def directory(p: Path) -> None:
    p.mkdir()
    (p / "x").write_text(GOOD)


def symlink_loop(p: Path) -> None:
    p.symlink_to(p.name)  # meta.properties -> meta.properties


def symlink_cycle(p: Path) -> None:
    other = p.with_name("other.properties")
    p.symlink_to(other.name)
    other.symlink_to(p.name)


def dangling(p: Path) -> None:
    p.symlink_to(p.with_name("gone.properties"))


def fifo(p: Path) -> None:
    os.mkfifo(p)


def device(p: Path) -> None:
    p.symlink_to("/dev/zero")  # endless: must not be read to its end


def unix_socket(p: Path) -> None:
    if len(str(p)) > 100:
        pytest.skip("the socket's path is too long for AF_UNIX")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(p))
    s.close()  # the socket file stays


def huge(p: Path) -> None:
    p.write_text(GOOD + "# padding\n" * (MAX_IDENTITY_BYTES // 10 + 1))


def sparse(p: Path) -> None:
    with p.open("wb") as f:
        f.truncate(10 * 2**30)  # 10 GiB that take no disk: refused without reading


# (id, how to make it, words the message holds)
SHAPES: list[tuple[str, Callable[[Path], None], str]] = [
    ("directory", directory, "is a directory, not a file"),
    ("symlink-to-itself", symlink_loop, "is a symbolic link that loops"),
    ("symlink-cycle", symlink_cycle, "is a symbolic link that loops"),
    ("dangling-symlink", dangling, "which does not exist"),
    ("fifo", fifo, "is a FIFO, not a file"),
    ("device", device, "is a character device, not a file"),
    ("socket", unix_socket, "cannot be opened"),
    ("huge", huge, f"an identity is at most {MAX_IDENTITY_BYTES}"),
    ("sparse-10GiB", sparse, "bytes (an identity is at most"),
    ("empty", raw(b""), "is empty"),
    ("only-comments", text("# a comment\n! another\n\n"), "is empty"),
    ("blank-lines", text("\n \n\t\n"), "is empty"),
    ("not-utf8", raw(b"version=1\ndirectory.id=\xff\xfe\n"), "is not text"),
    ("binary-garbage", raw(bytes(range(256)) * 4), "is not text"),
    ("nul-bytes", raw(b"\x00" * 64), "is not key=value"),
    ("utf16", raw(GOOD.encode("utf-16")), "is not text"),
    ("control-characters", text("version=1\ndirectory.id=d\x00\x07\n"), "control characters"),
    ("no-equals-sign", text("version=1\ndirectory.id=d\ngarbage line\n"), "is not key=value"),
    ("no-key", text("version=1\ndirectory.id=d\n=value\n"), "is not key=value"),
    ("no-version", text("cluster.id=c\ndirectory.id=d\n"), "version None"),
    ("no-directory-id", text("version=1\ncluster.id=c\n"), "no directory.id"),
    ("empty-directory-id", text("version=1\ndirectory.id=\n"), "no directory.id"),
    ("duplicate-key", text(GOOD + "directory.id=e\n"), "sets directory.id twice"),
    ("duplicate-version", text("version=1\n" + GOOD), "sets version twice"),
    ("version-2", text("version=2\ndirectory.id=d\n"), "version '2'"),
    ("version-0", text("version=0\ndirectory.id=d\n"), "version '0'"),
    ("version-underscore", text("version=0_1\ndirectory.id=d\n"), "version '0_1'"),
    ("version-hex", text("version=0x1\ndirectory.id=d\n"), "version '0x1'"),
    ("version-fullwidth", text("version=１\ndirectory.id=d\n"), "version '１'"),
    ("version-word", text("version=one\ndirectory.id=d\n"), "version 'one'"),
    ("version-huge", text("version=99999999999\ndirectory.id=d\n"), "version '99999999999'"),
    ("bad-role", text(GOOD + "process.role=admin\n"), "process.role 'admin'"),
    ("bad-log-created", text(GOOD + "log.created=yes\n"), "log.created 'yes'"),
    ("broker-node-id-underscore", text(BROKER + "node.id=1_0\n"), "not a broker id"),
    ("broker-node-id-hex", text(BROKER + "node.id=0x1\n"), "not a broker id"),
    ("broker-node-id-fullwidth", text(BROKER + "node.id=１\n"), "not a broker id"),
    ("broker-node-id-negative", text(BROKER + "node.id=-1\n"), "not a broker id"),
    ("broker-node-id-too-large", text(BROKER + "node.id=2147483648\n"), "not a broker id"),
    ("broker-node-id-name", text(BROKER + "node.id=b1\n"), "not a broker id"),
]


@pytest.fixture(params=SHAPES, ids=[s[0] for s in SHAPES])
def damaged(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A data directory whose meta.properties has the shape; (directory, words)."""
    _, make, words = request.param
    d = tmp_path / "data"
    d.mkdir()
    make(d / IDENTITY_FILE)
    yield d, words


def test_read_identity_names_the_file_and_the_shape(damaged: tuple[Path, str]) -> None:
    d, words = damaged
    with pytest.raises(StorageIdentityError) as raised:
        read_identity(d)
    assert raised.value.code == "INVALID_STORAGE_IDENTITY"
    assert str(d / IDENTITY_FILE) in raised.value.message
    assert words in raised.value.message


def test_the_controllers_start_up_check_refuses_it(damaged: tuple[Path, str]) -> None:
    d, _ = damaged
    with pytest.raises(StorageIdentityError, match=re.escape(str(d / IDENTITY_FILE))) as raised:
        asyncio.run(check_storage(d, None))
    assert raised.value.code == "INVALID_STORAGE_IDENTITY"


def test_the_brokers_start_up_check_refuses_it(damaged: tuple[Path, str]) -> None:
    d, _ = damaged
    with pytest.raises(StorageIdentityError, match=re.escape(str(d / IDENTITY_FILE))) as raised:
        check_broker_storage(d, broker_id=1, cluster_id=None)
    assert raised.value.code == "INVALID_STORAGE_IDENTITY"


@pytest.mark.parametrize("command", ["info", "format"])
def test_metactl_storage_names_it_without_a_traceback(
    damaged: tuple[Path, str], command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    d, _ = damaged
    status = main(["storage", command, "--data-dir", str(d)])
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert status == 1, (out, err)
    assert "Traceback" not in err
    assert len(errors) == 1 and errors[0].startswith("error: INVALID_STORAGE_IDENTITY: "), err
    assert str(d / IDENTITY_FILE) in errors[0]


def test_unreadable_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / IDENTITY_FILE).write_text(GOOD)
    real_open = os.open

    def refusing(path: object, *args: object, **kwargs: object) -> int:
        if str(path).endswith(IDENTITY_FILE):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", refusing)
    with pytest.raises(StorageIdentityError, match=r"cannot be opened \(Permission denied\)"):
        read_identity(tmp_path)


def test_a_data_directory_that_is_a_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(StorageIdentityError, match="which is not a directory"):
        read_identity(tmp_path / "file")


def test_what_kafka_reads_is_still_read(tmp_path: Path) -> None:
    """The shapes around the refused ones: no file is no identity; Kafka's parser takes
    `version=01` and a broker's `node.id=+01` (as 1); a controller's node.id is a name;
    a file at the size limit, a symbolic link to a good file and CRLF lines are read."""
    assert read_identity(tmp_path / "absent") is None
    assert read_identity(tmp_path) is None
    (tmp_path / IDENTITY_FILE).write_text("version=01\ndirectory.id=d\n")
    assert read_identity(tmp_path) is not None
    (tmp_path / IDENTITY_FILE).write_text(BROKER + "node.id=+01\n")
    identity = read_identity(tmp_path)
    assert identity is not None and identity.node_id == "1"
    (tmp_path / IDENTITY_FILE).write_text(GOOD + "process.role=controller\nnode.id=c1\n")
    identity = read_identity(tmp_path)
    assert identity is not None and identity.node_id == "c1"
    body = GOOD.encode()
    (tmp_path / IDENTITY_FILE).write_bytes(body + b"#" * (MAX_IDENTITY_BYTES - len(body)))
    assert read_identity(tmp_path) is not None
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / IDENTITY_FILE).write_text(GOOD.replace("\n", "\r\n"))
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / IDENTITY_FILE).symlink_to(tmp_path / "real" / IDENTITY_FILE)
    identity = read_identity(tmp_path / "linked")
    assert identity is not None and identity.directory_id == "d"


def test_a_broker_dir_formatted_with_node_id_01_takes_broker_1(tmp_path: Path) -> None:
    """node.id is compared as Kafka reads it: 01 is broker 1, not another node."""
    (tmp_path / IDENTITY_FILE).write_text(GOOD + "node.id=01\n")
    check_broker_storage(tmp_path, broker_id=1, cluster_id="c")  # not INCONSISTENT_NODE_ID
    identity = read_identity(tmp_path)  # now a broker's: its node.id read as a number
    assert identity is not None and identity.role == "broker" and identity.node_id == "1"


# --- real processes: the exact symptom, and a FIFO that must not hang ----------------


@pytest.mark.slow
@pytest.mark.parametrize("make", [directory, fifo], ids=["directory", "fifo"])
@pytest.mark.parametrize("process", ["controller", "broker"])
def test_a_real_process_refuses_it_by_name(
    tmp_path: Path, process: str, make: Callable[[Path], None]
) -> None:
    d = tmp_path / "data"
    d.mkdir()
    make(d / IDENTITY_FILE)
    if process == "controller":
        cmd = [sys.executable, "-m", "ops.cli", "controller", "serve", "--data-dir", str(d),
               "--listen", "127.0.0.1:0", "--insecure"]  # fmt: skip
    else:
        cmd = [sys.executable, "-m", "brokers_stub", "--id", "1", "--controller",
               "127.0.0.1:1", "--data-dir", str(d), "--insecure"]  # fmt: skip
    r = subprocess.run(
        cmd, capture_output=True, text=True, cwd=REPO, timeout=EXIT_BOUND_S, check=False
    )
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "READY" not in r.stdout and "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, r.stderr
    assert errors[0].startswith("error: INVALID_STORAGE_IDENTITY: "), r.stderr
    assert str(d / IDENTITY_FILE) in errors[0]
