"""`metactl cluster up` opens a Kafka listener on every broker (issue 32, slice 2): the
banner names each broker's Kafka address and a `kcat -L` line that works as printed
(over mutual TLS with the cluster's certificates), the record keeps the addresses so
that `metactl broker start` brings a broker back on the same one, and bad port flags
are named errors.

Real processes (`cluster up` as a subprocess, Debian's kcat); waiting is on what kcat
sees, never a timed assertion.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ops.cluster_cmds import kafka_lines
from tests.ops.test_cluster_supervision import pids
from tests.ops.test_cluster_up import Up, metactl
from tests.processes import wait_for

pytestmark = pytest.mark.slow
KCAT = shutil.which("kcat")
needs_kcat = pytest.mark.skipif(KCAT is None, reason="kcat missing: run `make system`")


def kafka_banner(banner: list[str]) -> tuple[dict[int, str], list[str]]:
    """The brokers' Kafka addresses, by id, and the printed kcat command, as arguments."""
    at = next(i for i, line in enumerate(banner) if line.startswith("  kafka:    brokers "))
    addresses = {int(b): a for b, a in re.findall(r"(\d+): (\S+?:\d+)", banner[at])}
    return addresses, shlex.split(banner[at + 1])


def kcat_brokers(kcat: list[str]) -> dict[int, str] | None:
    """The brokers kcat lists (id: host:port), or None while it cannot get metadata."""
    r = subprocess.run(
        [*kcat, "-J", "-m", "30"], capture_output=True, text=True, timeout=60, check=False
    )
    if r.returncode != 0:
        return None
    meta: dict[str, Any] = json.loads(r.stdout)
    return {b["id"]: b["name"] for b in meta["brokers"]}


@needs_kcat
def test_cluster_up_opens_a_kafka_listener_per_broker_and_prints_kcat(tmp_path: Path) -> None:
    data = tmp_path / "data"
    up = Up(data, "--brokers", "2")  # mutual TLS; Up gives --kafka-base-port 0
    try:
        banner = up.await_banner()
        kafka, kcat = kafka_banner(banner)
        assert set(kafka) == {1, 2} and len(set(kafka.values())) == 2, banner
        assert all(not a.endswith(":0") for a in kafka.values())  # the ports bound
        certs = (data / "certs").resolve()
        assert kcat[:3] == ["kcat", "-L", "-b"]
        assert kcat[3].split(",") == [kafka[1], kafka[2]]
        assert "security.protocol=SSL" in kcat
        assert f"ssl.ca.location={certs / 'ca.pem'}" in kcat
        assert f"ssl.certificate.location={certs / 'admin.pem'}" in kcat
        assert f"ssl.key.location={certs / 'admin-key.pem'}" in kcat

        # The printed line, as printed (plus -J), against one broker: both brokers.
        one = [*kcat[:3], kafka[2], *kcat[4:]]
        assert wait_for("kcat listing both brokers", lambda: kcat_brokers(one) == kafka)

        # The record keeps each broker's Kafka address, its port pinned in its argv.
        record = json.loads((data / "cluster-up.json").read_text())
        for b in (1, 2):
            entry = record["brokers"][str(b)]
            assert entry["kafka"] == kafka[b]
            argv = entry["argv"]
            assert argv[argv.index("--kafka-listen") + 1] == kafka[b]
            assert "--tls-dir" in argv  # the same TLS as the rest of the cluster

        # A killed broker comes back on the same Kafka address (`broker start`).
        os.kill(pids(banner)["broker 2"], signal.SIGKILL)
        r = metactl("broker", "start", "--id", "2", "--data-dir", str(data), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert f"kafka {kafka[2]}" in r.stdout
        only_2 = [*kcat[:3], kafka[2], *kcat[4:]]
        assert wait_for("broker 2's listener back", lambda: kcat_brokers(only_2) == kafka)
    finally:
        assert up.stop() == 0


def test_the_kcat_line_with_insecure_has_no_tls_options() -> None:
    where, kcat = kafka_lines({2: "127.0.0.1:19093", 1: "127.0.0.1:19092"}, None)
    assert where.startswith("  kafka:    brokers 1: 127.0.0.1:19092, 2: 127.0.0.1:19093  ")
    assert shlex.split(kcat)[:4] == ["kcat", "-L", "-b", "127.0.0.1:19092,127.0.0.1:19093"]
    assert "-X" not in shlex.split(kcat)


def test_no_kafka_opens_none(tmp_path: Path) -> None:
    up = Up(tmp_path / "data", "--insecure", "--no-kafka")
    try:
        banner = up.await_banner()
        assert not any(line.startswith("  kafka:") for line in banner)
        record = json.loads((tmp_path / "data" / "cluster-up.json").read_text())
        assert "--kafka-listen" not in record["brokers"]["1"]["argv"]
        assert record["brokers"]["1"]["kafka"] is None
    finally:
        assert up.stop() == 0


@pytest.mark.parametrize(
    ("flags", "status", "message"),
    [
        # Broker 2 on the controller's port: named before anything starts.
        (
            ["--listen", "127.0.0.1:9093", "--kafka-base-port", "9092", "--brokers", "2"],
            2,
            "error: INVALID_CONFIG: port 9093 would be both the controller's --listen and "
            "broker 2's Kafka listener (--kafka-base-port)",
        ),
        (
            ["--kafka-base-port", "65535", "--brokers", "2"],
            2,
            "error: INVALID_CONFIG: broker 2's Kafka listener (--kafka-base-port) would be "
            "port 65536, past 65535",
        ),
        (["--kafka-base-port", "65536"], 2, "argument --kafka-base-port: "),
        (["--kafka-base-port", "x"], 2, "argument --kafka-base-port: "),
        (["--kafka-base-port", "0", "--no-kafka"], 2, "not allowed with argument"),
    ],
)
def test_bad_kafka_port_flags_are_named(
    flags: list[str], status: int, message: str, tmp_path: Path
) -> None:
    r = metactl(
        "cluster", "up", "--data-dir", str(tmp_path / "data"), "--insecure", "--metrics",
        "127.0.0.1:0", *flags, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == status, r.stderr
    assert message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "data" / "logs").exists()  # nothing was started
