"""The lifecycle commands are secure by default, as every client command is: without
certificates (and without `--insecure`) each says what to do before sending anything;
under mutual TLS (a real controller, real CLI subprocesses) `viewer` may read configs,
features and reassignments and may change nothing, which `admin` may."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from controller.core.config import ControllerConfig
from controller.runtime.clock import VirtualClock
from controller.runtime.service import ControllerService
from localcluster.certs import default_names, init_certs
from metadata_log.records import ELR_FEATURE
from ops.cli import main
from protocol.flags import ENV_TLS_DIR
from protocol.tls import TlsIdentity
from tests.ops.test_lifecycle_cli import one_error

CLIENT_COMMANDS = [
    ["configs", "--entity-type", "brokers", "--entity-default", "--describe"],
    ["configs", "--entity-type", "topics", "--entity-name", "t", "--alter",
     "--add-config", "min.insync.replicas=2"],
    ["features", "describe"],
    ["features", "downgrade", "--feature", f"{ELR_FEATURE}=0"],
    ["topics", "delete", "--topic", "t"],
    ["topics", "alter", "--topic", "t", "--partitions", "2"],
    ["reassign", "--list"],
    ["brokers", "unregister", "--id", "1"],
]  # fmt: skip


@pytest.mark.parametrize("command", CLIENT_COMMANDS, ids=[" ".join(c[:2]) for c in CLIENT_COMMANDS])
def test_without_certificates_a_command_says_what_to_do(
    command: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./data/certs here
    monkeypatch.delenv(ENV_TLS_DIR, raising=False)
    assert main([*command, "--controller", "127.0.0.1:1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "TLS is on by default" in one_error(err, "INVALID_CONFIG")


async def as_principal(
    svc: ControllerService, certs: Path, principal: str, *args: str
) -> tuple[int, str, str]:
    """`metactl ARGS` as `principal` under mutual TLS, a real subprocess."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ops.cli", *args, "--bootstrap-controller", svc.address,
        "--tls-dir", str(certs), "--principal", principal,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_under_tls_viewer_reads_and_only_admin_changes(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    init_certs(certs, default_names([]))
    svc = ControllerService(
        tmp_path / "controller",
        "127.0.0.1:0",
        config=ControllerConfig(),
        clock=VirtualClock(1_700_000_000_000),
        tls=TlsIdentity.from_dir(certs, "controller"),
    )
    await svc.start()
    try:
        default = ("configs", "--entity-type", "brokers", "--entity-default")
        for read in [(*default, "--describe"), ("features", "describe"), ("reassign", "--list")]:
            rc, out, err = await as_principal(svc, certs, "viewer", *read)
            assert (rc, err) == (0, "") and out, read
        change = (*default, "--alter", "--add-config", "min.insync.replicas=2")
        for write, code in [
            (change, "CLUSTER_AUTHORIZATION_FAILED"),
            (("features", "downgrade", "--feature", f"{ELR_FEATURE}=0"),
             "CLUSTER_AUTHORIZATION_FAILED"),
            (("brokers", "unregister", "--id", "1"), "CLUSTER_AUTHORIZATION_FAILED"),
            (("topics", "delete", "--topic", "t"), "TOPIC_AUTHORIZATION_FAILED"),
            (("topics", "alter", "--topic", "t", "--partitions", "2"),
             "TOPIC_AUTHORIZATION_FAILED"),
        ]:  # fmt: skip
            rc, _, err = await as_principal(svc, certs, "viewer", *write)
            assert rc == 1 and "viewer" in one_error(err, code), (write, err)
        image = svc.controller.committed_image
        assert image.cluster_min_isr(1) == 1 and image.features[ELR_FEATURE] == 1
        rc, _, err = await as_principal(svc, certs, "admin", *change)
        assert (rc, err) == (0, "") and svc.controller.committed_image.cluster_min_isr(1) == 2
    finally:
        await svc.stop()
