"""`cluster up --etcd-base-port` (issue 33, item 3): etcd member N on PORT + 2(N - 1)
(client) and the next (peer), 12379 and up by default, below the kernel's ephemeral
range; a bad value is a named error before anything starts; a directory keeps the ports
of its first start (another --etcd-base-port there is refused, naming the flag); and a
port in use is refused naming the flag that moves it, with real sockets (the CLI as a
subprocess)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from localcluster.etcd import LocalEtcd
from localcluster.ports import await_listenable, cluster_listeners, ephemeral_range
from localcluster.settings import DEFAULT_ETCD_BASE_PORT, UpSettings
from metactl.errors import InvalidConfigurationError, ListenError
from tests.e2e.cluster import free_block

REPO = Path(__file__).resolve().parents[2]


def metactl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", *args], capture_output=True, text=True, cwd=cwd,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120, check=False,
    )  # fmt: skip


@contextmanager
def listening(port: int) -> Iterator[socket.socket]:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
        yield s


def test_the_default_etcd_ports_are_below_the_ephemeral_range() -> None:
    s = UpSettings(Path("d"), controllers=3, etcd=3)
    etcd = [p for p in s.planned() if p.flag == "--etcd-base-port"]
    assert [p.port for p in etcd] == list(range(DEFAULT_ETCD_BASE_PORT, DEFAULT_ETCD_BASE_PORT + 6))
    assert etcd[1].who == "etcd member 1's peer port (--etcd-base-port)"
    assert max(p.port for p in s.planned()) < ephemeral_range()[0]
    s.check()  # clear of the controllers', the brokers' and the Kafka ports
    # LocalEtcd is given them for a first start only (a kept directory keeps its own).
    assert (s.etcd_pinned_base_port, s.etcd_first_base_port) == (None, DEFAULT_ETCD_BASE_PORT)
    pinned = UpSettings(Path("d"), etcd=1, etcd_base_port=15000)
    assert (pinned.etcd_pinned_base_port, pinned.etcd_first_base_port) == (15000, 15000)
    free = UpSettings(Path("d"), etcd=1, etcd_base_port=0)
    assert (free.etcd_pinned_base_port, free.etcd_first_base_port) == (None, None)
    assert not [p for p in free.planned() if p.flag == "--etcd-base-port"]


@pytest.mark.parametrize(
    ("flags", "status", "message"),
    [
        (["--etcd", "1", "--etcd-base-port", "x"], 2, "argument --etcd-base-port: "),
        (["--etcd", "1", "--etcd-base-port", "-1"], 2, "argument --etcd-base-port: "),
        (["--etcd", "1", "--etcd-base-port", "65536"], 2, "argument --etcd-base-port: "),
        (
            ["--etcd", "1", "--etcd-base-port", "80"],
            2,
            "error: INVALID_CONFIG: --etcd-base-port 80: etcd's ports must be 1024 or above",
        ),
        (
            ["--etcd-base-port", "15000"],
            2,
            "error: INVALID_CONFIG: --etcd-base-port 15000 without --etcd",
        ),
        (
            ["--etcd", "3", "--etcd-base-port", "65531"],
            2,
            "error: INVALID_CONFIG: etcd member 3's peer port (--etcd-base-port) would be "
            "port 65536, past 65535",
        ),
        (
            ["--etcd", "1", "--listen", "127.0.0.1:15001", "--etcd-base-port", "15000"],
            2,
            "error: INVALID_CONFIG: port 15001 would be both the controller's --listen and "
            "etcd member 1's peer port (--etcd-base-port): move one of them",
        ),
    ],
)
def test_bad_etcd_base_ports_are_named(
    flags: list[str], status: int, message: str, tmp_path: Path
) -> None:
    r = metactl(
        "cluster", "up", "--data-dir", str(tmp_path / "data"), "--insecure", "--metrics",
        "127.0.0.1:0", "--kafka-base-port", "0", *flags, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == status, r.stderr
    assert message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "data" / "logs").exists()  # nothing was started


@pytest.mark.slow
def test_a_busy_etcd_port_names_the_flag_before_anything_starts(tmp_path: Path) -> None:
    base = free_block(2)
    with listening(base + 1):
        r = metactl(
            "cluster", "up", "--data-dir", str(tmp_path / "data"), "--insecure", "--etcd", "1",
            "--etcd-base-port", str(base), "--listen", "127.0.0.1:0", "--metrics",
            "127.0.0.1:0", "--kafka-base-port", "0", "--no-events", cwd=tmp_path,
        )  # fmt: skip
    assert r.returncode != 0
    assert (
        f"error: LISTEN_FAILED: 127.0.0.1:{base + 1} (etcd member etcd-1's peer port) is in "
        "use: another process listens on it (LISTEN "
    ) in r.stderr, r.stderr
    assert "move the etcd members' ports with --etcd-base-port" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "data" / "etcd" / "etcd-1").exists()  # no member started


def test_a_kept_directory_keeps_its_ports_and_refuses_other_ones(tmp_path: Path) -> None:
    first = free_block(2)
    LocalEtcd(tmp_path, 1, base_port=first)._save_ports()  # as its first start keeps them
    # cluster up without the flag: the kept ports, whatever its default.
    again = LocalEtcd(tmp_path, 1, default_base_port=first + 100)
    assert (again.members[0].client_port, again.members[0].peer_port) == (first, first + 1)
    assert again.kept_ports
    with pytest.raises(InvalidConfigurationError, match=f"use --etcd-base-port {first} or a new"):
        LocalEtcd(tmp_path, 1, base_port=first + 100)
    fresh = LocalEtcd(tmp_path / "new", 1, default_base_port=first + 100)
    assert fresh.members[0].client_port == first + 100 and not fresh.kept_ports


def test_a_busy_kept_port_names_ports_json_and_a_new_data_dir(tmp_path: Path) -> None:
    base = free_block(2)
    LocalEtcd(tmp_path, 1, base_port=base)._save_ports()
    with listening(base), pytest.raises(ListenError) as refused:
        LocalEtcd(tmp_path, 1).start()
    text = refused.value.message
    assert f"127.0.0.1:{base} (etcd member etcd-1's client port) is in use" in text
    assert f"kept in {tmp_path / 'ports.json'}" in text
    assert "start on a new --data-dir, which chooses them again (from --etcd-base-port)" in text


@pytest.mark.parametrize(
    ("block", "offset", "who", "flag"),
    [
        ("native", 0, "controller 1's --listen", "--listen"),
        ("native", 3, "controller 2's /metrics (--metrics)", "--metrics"),
        ("native", 4, "broker 1's /metrics (--metrics)", "--metrics"),
        ("kafka", 0, "broker 1's Kafka listener (--kafka-base-port)", "--kafka-base-port"),
        ("kafka", 101, "controller 2's Kafka listener (--kafka-base-port + 100)",
         "--kafka-base-port"),
    ],
)  # fmt: skip
def test_a_busy_cluster_port_names_the_flag_that_moves_it(
    block: str, offset: int, who: str, flag: str
) -> None:
    # --listen on native..+1 (2 controllers), --metrics on +2..+4 (then 1 broker);
    # Kafka: broker 1 on kafka, the controllers on kafka+100 and +101.
    bases = {"native": free_block(5), "kafka": free_block(102)}
    s = UpSettings(
        Path("d"), brokers=1, controllers=2, etcd=1, listen=f"127.0.0.1:{bases['native']}",
        metrics=f"127.0.0.1:{bases['native'] + 2}", kafka_base_port=bases["kafka"],
    )  # fmt: skip
    busy = bases[block] + offset
    assert {p.port: p.who for p in s.listeners()}[busy] == who
    with listening(busy), pytest.raises(ListenError) as refused:
        await_listenable(cluster_listeners(s.listeners()), wait_s=0)
    assert f"127.0.0.1:{busy} ({who}) is in use" in refused.value.message
    assert f"move it with {flag} (port 0: any free port)" in refused.value.message
    await_listenable(cluster_listeners(s.listeners()), wait_s=0)  # free again
