"""`metactl cluster up` opens a Kafka listener on every broker (issue 32, slice 2) and
every controller (KIP-919): the banner names each broker's Kafka address and a `kcat -L`
line that works as printed (over mutual TLS with the cluster's certificates), then the
controllers'; the record keeps the addresses (ports pinned in the command lines) so
that `metactl broker start` brings a broker back on the same one; the controller's
listener answers ApiVersions and DescribeQuorum; the README's "Use it from Kafka
clients" snippets (kcat and confluent-kafka: produce, then consume) run as printed, the
addresses aside; and bad port flags are named errors.

Real processes (`cluster up` as a subprocess, Debian's kcat, confluent-kafka); waiting
is on what kcat sees, never a timed assertion.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kio.schema.api_versions.v3 import ApiVersionsRequest, ApiVersionsResponse
from kio.schema.describe_quorum.v2 import DescribeQuorumRequest, DescribeQuorumResponse
from kio.schema.describe_quorum.v2.request import PartitionData, TopicData
from kio.schema.errors import ErrorCode
from kio.schema.types import TopicName
from kio.static.primitive import i32

from ops.cluster_cmds import kafka_lines
from protocol.tls import VIEWER
from tests.kafka_wire import call, client_context
from tests.ops.test_cluster_supervision import pids
from tests.ops.test_cluster_up import REPO, Up, env, metactl
from tests.processes import wait_for

pytestmark = pytest.mark.slow
KCAT = shutil.which("kcat")
needs_kcat = pytest.mark.skipif(KCAT is None, reason="kcat missing: run `make system`")


def kafka_banner(banner: list[str]) -> tuple[dict[int, str], list[str]]:
    """The brokers' Kafka addresses, by id, and the printed kcat command, as arguments."""
    at = next(i for i, line in enumerate(banner) if line.startswith("  kafka:    brokers "))
    addresses = {int(b): a for b, a in re.findall(r"(\d+): (\S+?:\d+)", banner[at])}
    return addresses, shlex.split(banner[at + 1])


def stop(up: Up) -> None:
    """Ctrl-C; it exits 0, else its stderr says why."""
    status = up.stop()
    assert up.proc.stderr is not None
    assert status == 0, up.proc.stderr.read()[-4000:]


def controller_kafka_banner(banner: list[str]) -> str:
    """The (one) controller's Kafka address, from the line after the kcat line."""
    at = next(i for i, line in enumerate(banner) if line.startswith("  kafka:    brokers "))
    words = banner[at + 2].split()
    assert words[0] == "controller", banner[at + 2]
    return words[1]


def readme_kafka_snippets(brokers: list[str], controller: str) -> list[str]:
    """The README's "Use it from Kafka clients" shell blocks, made for this cluster: its
    brokers' Kafka addresses for `make run`'s, and the controller's address for the
    CLI's default; `.venv/bin/` is this environment's."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Use it from Kafka clients") :]
    section = section[: section.index("\n## ", 1)]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert len(blocks) == 2, blocks  # kcat, then confluent-kafka
    made = "127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094"
    assert all(made in b for b in blocks)
    bin_dir = f"{Path(sys.executable).parent}/"
    return [
        b.replace(made, ",".join(brokers))
        .replace(".venv/bin/metactl topics create", f".venv/bin/metactl topics create "
                 f"--bootstrap-controller {controller}")
        .replace(".venv/bin/", bin_dir)
        for b in blocks
    ]  # fmt: skip


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
    up = Up(data, "--brokers", "3")  # mutual TLS; Up gives --kafka-base-port 0
    try:
        banner = up.await_banner()
        kafka, kcat = kafka_banner(banner)
        assert set(kafka) == {1, 2, 3} and len(set(kafka.values())) == 3, banner
        assert all(not a.endswith(":0") for a in kafka.values())  # the ports bound
        certs = (data / "certs").resolve()
        assert kcat[:3] == ["kcat", "-L", "-b"]
        assert kcat[3].split(",") == [kafka[1], kafka[2], kafka[3]]
        assert "security.protocol=SSL" in kcat
        assert f"ssl.ca.location={certs / 'ca.pem'}" in kcat
        assert f"ssl.certificate.location={certs / 'admin.pem'}" in kcat
        assert f"ssl.key.location={certs / 'admin-key.pem'}" in kcat

        # The printed line, as printed (plus -J), against one broker: both brokers.
        one = [*kcat[:3], kafka[2], *kcat[4:]]
        assert wait_for("kcat listing both brokers", lambda: kcat_brokers(one) == kafka)

        # The record keeps each broker's Kafka address, its port pinned in its argv, and
        # the controller's.
        record = json.loads((data / "cluster-up.json").read_text())
        for b in (1, 2, 3):
            entry = record["brokers"][str(b)]
            assert entry["kafka"] == kafka[b]
            argv = entry["argv"]
            assert argv[argv.index("--kafka-listen") + 1] == kafka[b]
            assert "--tls-dir" in argv  # the same TLS as the rest of the cluster
        controller = controller_kafka_banner(banner)
        assert not controller.endswith(":0") and controller not in kafka.values()
        entry = record["controller_processes"]["1"]
        assert (entry["kafka"], entry["listen"]) == (controller, record["controllers"][0])
        assert entry["argv"][entry["argv"].index("--kafka-listen") + 1] == controller
        assert entry["pid"] == pids(banner)["controller"] and "--tls-dir" in entry["argv"]

        # The controller's Kafka listener (KIP-919), kio-framed: librdkafka has no
        # bootstrap.controllers. The cluster's TLS; a viewer may read.
        tls = client_context(certs, VIEWER)
        hello = ApiVersionsRequest(client_software_name="t", client_software_version="1")
        versions = call(controller, hello, ApiVersionsResponse, tls)
        served = {v.api_key for v in versions.api_keys}
        assert versions.error_code == ErrorCode.none and 55 in served and 3 not in served
        metadata = TopicData(
            topic_name=TopicName("__cluster_metadata"),
            partitions=(PartitionData(partition_index=i32(0)),),
        )
        quorum = call(
            controller, DescribeQuorumRequest(topics=(metadata,)), DescribeQuorumResponse, tls
        )
        (p,) = quorum.topics[0].partitions
        assert p.error_code == ErrorCode.none and p.high_watermark > 0
        assert [f"{x.host}:{x.port}" for n in quorum.nodes for x in n.listeners] == [controller]

        # The README's snippets, as printed but for the addresses: kcat -L, a topic,
        # kcat -P and -C; confluent-kafka's idempotent producer and assign()ing consumer.
        kcat_block, python_block = readme_kafka_snippets(
            [kafka[1], kafka[2], kafka[3]], record["controllers"][0]
        )
        ran = [
            subprocess.run(["bash", "-euo", "pipefail", "-c", block], capture_output=True,
                           text=True, cwd=tmp_path, env=env(), timeout=120, check=False)
            for block in (kcat_block, python_block)
        ]  # fmt: skip
        assert [r.returncode for r in ran] == [0, 0], [(r.stdout, r.stderr) for r in ran]
        assert 'topic "demo" with 2 partitions' in ran[0].stdout  # kcat -L (Up: 2 partitions)
        consumed = ran[0].stdout.splitlines()[-2:]  # kcat -C: "greetings-P@O value"
        assert sorted(line.split(" ", 1)[1] for line in consumed) == ["from kcat", "hello"]
        values = sorted(line.split(" ", 1)[1] for line in ran[1].stdout.splitlines())
        assert values == sorted(["hello", "from kcat", *(f"hello {i}" for i in range(5))])

        # A killed broker comes back on the same Kafka address (`broker start`).
        os.kill(pids(banner)["broker 2"], signal.SIGKILL)
        r = metactl("broker", "start", "--id", "2", "--data-dir", str(data), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert f"kafka {kafka[2]}" in r.stdout
        only_2 = [*kcat[:3], kafka[2], *kcat[4:]]
        assert wait_for("broker 2's listener back", lambda: kcat_brokers(only_2) == kafka)
    finally:
        stop(up)


def test_the_kcat_line_with_insecure_has_no_tls_options() -> None:
    where, kcat = kafka_lines({2: "127.0.0.1:19093", 1: "127.0.0.1:19092"}, None)
    assert where.startswith("  kafka:    brokers 1: 127.0.0.1:19092, 2: 127.0.0.1:19093  ")
    assert shlex.split(kcat)[:4] == ["kcat", "-L", "-b", "127.0.0.1:19092,127.0.0.1:19093"]
    assert "-X" not in shlex.split(kcat)
    one = kafka_lines({1: "h:1"}, None, {1: "h:2"})[2].split()
    assert one[:2] == ["controller", "h:2"]
    three = kafka_lines({1: "h:1"}, None, {2: "h:3", 1: "h:2", 3: "h:4"})[2].split()
    assert three[:7] == ["controllers", "1:", "h:2,", "2:", "h:3,", "3:", "h:4"]


def test_no_kafka_opens_none(tmp_path: Path) -> None:
    up = Up(tmp_path / "data", "--insecure", "--no-kafka")
    try:
        banner = up.await_banner()
        assert not any(line.startswith("  kafka:") for line in banner)
        record = json.loads((tmp_path / "data" / "cluster-up.json").read_text())
        assert "--kafka-listen" not in record["brokers"]["1"]["argv"]
        assert record["brokers"]["1"]["kafka"] is None
        assert "--kafka-listen" not in record["controller_processes"]["1"]["argv"]
        assert record["controller_processes"]["1"]["kafka"] is None
    finally:
        stop(up)


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
