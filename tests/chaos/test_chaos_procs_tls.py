"""`chaos run --etcd M` runs its etcd as `cluster up --etcd N` does (issue 21 gap): TLS
with client-certificate auth, the certificates made in the run's data directory, each
controller given its etcd certificate by flag and the runner's own client the admin's.

Before, the chaos etcd ran in plaintext and the controllers were given no etcd TLS flags,
so a ``METACTL_ETCD_CACERT`` in the environment made every controller speak TLS to a
plaintext etcd and fail to start. The first test reads the commands (no processes); the
second starts a real etcd and controller with another CA's files in those variables.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from chaos.processes import Processes, port_plan
from localcluster.certs import etcd_client_tls, init_etcd_certs
from metadata_log.etcd.client import Etcd
from metadata_log.etcd.lease import current_leader
from metadata_log.etcd.target import EtcdTarget
from metadata_log.etcd.tls import ENV_CACERT, ENV_CERT, ENV_KEY


def processes(root: Path, *, controllers: int, etcd: int) -> Processes:
    return Processes(
        root=root,
        brokers=1,
        strategy="balanced",
        elr=True,
        unclean_leader_election=False,
        ports=port_plan(None, controllers=controllers, etcd=etcd, brokers=1),
        etcd_members=etcd,
    )


def flag(cmd: list[str], name: str) -> Path:
    assert name in cmd, cmd
    return Path(cmd[cmd.index(name) + 1])


def test_the_chaos_etcd_runs_tls_and_every_client_gets_its_certificate(tmp_path: Path) -> None:
    p = processes(tmp_path, controllers=3, etcd=3)
    etcd = p.etcd
    assert etcd is not None
    # The members: TLS client and peer URLs, client certificates of the etcd CA required.
    assert etcd.tls_dir == tmp_path / "certs" / "etcd"
    assert all(m.client_url.startswith("https://") for m in etcd.members)
    assert all(m.peer_url.startswith("https://") for m in etcd.members)
    # Each controller: the controller's etcd certificate, by flag (flags win over the
    # METACTL_ETCD_* variables, so the environment cannot change what it speaks).
    for i in (1, 2, 3):
        cmd = p.controller_cmd(i)
        assert flag(cmd, "--etcd-cacert") == etcd.tls_dir / "ca.pem"
        assert flag(cmd, "--etcd-cert").name == "controller.pem"
        assert flag(cmd, "--etcd-key").name == "controller-key.pem"
        for name in ("--etcd-cacert", "--etcd-cert", "--etcd-key"):
            assert flag(cmd, name).is_file()
    # The runner's own client (its linearizable reads of state/end): the admin's.
    tls = p.etcd_tls
    assert tls is not None and tls.cert is not None and tls.cert.name == "admin.pem"
    assert tls.cacert == etcd.tls_dir / "ca.pem"


def test_a_sqlite_chaos_run_has_no_etcd_and_makes_no_certificates(tmp_path: Path) -> None:
    p = processes(tmp_path, controllers=1, etcd=0)
    assert p.etcd is None and p.etcd_tls is None
    assert not any(a.startswith("--etcd") or a == "--metadata-log" for a in p.controller_cmd(1))
    assert not (tmp_path / "certs").exists()


@pytest.mark.slow
async def test_etcd_variables_of_another_ca_change_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another CA's etcd files in METACTL_ETCD_*: the controller still starts on the
    chaos etcd (over TLS, with its own certificate), the runner's client still reads it,
    and a plaintext client is refused."""
    other = tmp_path / "other-certs"
    init_etcd_certs(other)
    foreign = etcd_client_tls(other)
    assert foreign.cert is not None and foreign.key is not None
    monkeypatch.setenv(ENV_CACERT, str(foreign.cacert))
    monkeypatch.setenv(ENV_CERT, str(foreign.cert))
    monkeypatch.setenv(ENV_KEY, str(foreign.key))
    p = processes(tmp_path / "run", controllers=1, etcd=1)
    try:
        await p.start_etcd()
        await p.start_controller(1)
        assert p.controllers[1].state == "up"
        assert p.url is not None and p.etcd is not None
        client = await Etcd.connect(EtcdTarget.parse(p.url, tls=p.etcd_tls), timeout_s=5.0)
        try:
            async with asyncio.timeout(30):  # the controller became active through it
                while True:
                    info, _ = await current_leader(client)
                    if info is not None:
                        break
                    await asyncio.sleep(0.1)  # polling the leadership key
        finally:
            await client.close()
        plain = f"http://{p.etcd.members[0].endpoint}/health"
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            await asyncio.to_thread(urllib.request.urlopen, plain, None, 5)
    finally:
        await p.stop_all()
