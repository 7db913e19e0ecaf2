"""etcd over TLS (issue 21 item 9), against a real etcd member started with TLS and
client-certificate auth from `metactl certs init`'s etcd CA: the log is written and read
over TLS; a client without a certificate, with another CA's, or in plaintext is refused
with SSL_AUTHENTICATION_FAILED (a named error, no traceback), as is a controller process
started without its certificate; the scheme a local cluster first started with is kept;
the flags are checked before anything is opened; each member reports its own health."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from localcluster.certs import default_names, etcd_client_tls, etcd_dir, init_certs, init_etcd_certs
from localcluster.etcd import PORTS_FILE, LocalEtcd
from metactl.errors import InvalidConfigurationError, MetactlError, SslAuthenticationError
from metadata_log.etcd.client import Etcd
from metadata_log.etcd.health import member_health
from metadata_log.etcd.store import EtcdLogStore
from metadata_log.etcd.target import EtcdTarget
from metadata_log.etcd.tls import (
    ENV_CACERT,
    PROCESS_DEFAULT,
    EtcdTls,
    default_tls,
    etcd_tls_from,
    set_default_tls,
)
from metadata_log.identity_check import check_storage
from ops.cli import main
from protocol.tls import ADMIN, CA_CERT, cert_path, key_path
from tests.e2e.cluster import free_port
from tests.metadata_log.log_fixtures import records

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("certs")
    init_certs(d, default_names([1]))  # the cluster CA: not etcd's
    init_etcd_certs(d)
    return d


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory, certs: Path) -> Iterator[LocalEtcd]:
    cluster = LocalEtcd(tmp_path_factory.mktemp("etcd-tls"), 1, tls_dir=etcd_dir(certs)).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(autouse=True)
def _process_default() -> Iterator[None]:
    """A command's --etcd-* flags become the process's default: not the next test's."""
    yield
    set_default_tls(PROCESS_DEFAULT)


def url(cluster: LocalEtcd) -> str:
    return cluster.url(f"tls/{uuid.uuid4().hex[:10]}")


async def test_the_log_is_written_and_read_over_tls(tls_etcd: LocalEtcd) -> None:
    where = url(tls_etcd)
    assert where.startswith("etcd://127.0.0.1:")
    assert all(m.client_url.startswith("https://") for m in tls_etcd.members)
    client = await Etcd.connect(EtcdTarget.parse(where, tls=tls_etcd.client_tls()))
    store = await EtcdLogStore.open(where, client=client, cluster_id="tls")
    try:
        batch = records(5)
        await store.append(batch)
        assert [e.record for e in await store.read(0, 10)] == batch
    finally:
        await store.close()
        await client.close()
    # A reader with the admin's certificate, through the process default (a command's
    # flags), sees the same log.
    set_default_tls(tls_etcd.client_tls(ADMIN))
    reader = await EtcdLogStore.open(where, read_only=True)
    try:
        assert reader.end_offset == 5
    finally:
        await reader.close()


@pytest.mark.parametrize("who", ["no certificate", "plaintext", "another CA"])
async def test_a_client_without_an_etcd_certificate_is_refused_by_name(
    tls_etcd: LocalEtcd, certs: Path, who: str
) -> None:
    etcd_ca = etcd_dir(certs) / CA_CERT
    tls = {
        "no certificate": EtcdTls(etcd_ca),
        "plaintext": None,
        # The cluster CA's admin: etcd trusts only its own CA.
        "another CA": EtcdTls(certs / CA_CERT, cert_path(certs, ADMIN), key_path(certs, ADMIN)),
    }[who]
    with pytest.raises(SslAuthenticationError) as refused:
        await Etcd.connect(EtcdTarget.parse(url(tls_etcd), tls=tls), timeout_s=5)
    text = refused.value.message
    assert "--etcd-cacert" in text
    if who == "plaintext":
        assert "speaks TLS" in text


async def test_a_tls_client_of_a_plaintext_etcd_is_refused_by_name(
    etcd: LocalEtcd, certs: Path
) -> None:
    with pytest.raises(SslAuthenticationError, match="TLS failed"):
        await Etcd.connect(EtcdTarget.parse(url(etcd), tls=etcd_client_tls(certs)), timeout_s=5)


async def test_each_member_reports_its_own_health_over_tls(tls_etcd: LocalEtcd) -> None:
    client = await Etcd.connect(EtcdTarget.parse(url(tls_etcd), tls=tls_etcd.client_tls()))
    try:
        (member,) = await member_health(client)
    finally:
        await client.close()
    assert member.name == "etcd-1" and member.client_url == tls_etcd.members[0].client_url
    assert member.healthy and member.leader and member.raft_role == "leader", member
    assert member.raft_index is not None and member.raft_index > 0 and member.version


def test_the_cli_takes_the_etcd_flags_and_names_a_missing_certificate(
    tls_etcd: LocalEtcd, certs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    where = url(tls_etcd)
    admin = tls_etcd.client_tls(ADMIN)
    assert admin is not None and admin.cert is not None and admin.key is not None
    flags = ["--etcd-cacert", str(admin.cacert), "--etcd-cert", str(admin.cert)]
    flags += ["--etcd-key", str(admin.key)]
    data = certs.parent / f"ctl-{uuid.uuid4().hex[:6]}"
    data.mkdir()
    assert main(["storage", "format", "--data-dir", str(data), "--cluster-id", "tls-cli"]) == 0
    # The controller's storage check creates the log over TLS.
    asyncio.run(check_storage(data, where, cluster_id="tls-cli", etcd_tls=admin))
    capsys.readouterr()
    assert main(["log", "verify", "--data-dir", where, *flags]) == 0
    assert capsys.readouterr().out.startswith("ok: etcd://")
    assert main(["storage", "info", "--data-dir", str(data), "--json", *flags]) == 0
    assert '"cluster_id": "tls-cli"' in capsys.readouterr().out
    # Without them: one named line, status 1 (refused), no traceback.
    set_default_tls(PROCESS_DEFAULT)
    assert main(["log", "verify", "--data-dir", where]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: SSL_AUTHENTICATION_FAILED: ") and "speaks TLS" in err
    assert "Traceback" not in err and err.count("\n") == 1
    assert main(["log", "dump", "--data-dir", where, "--etcd-cacert", str(admin.cacert)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: SSL_AUTHENTICATION_FAILED: ") and "Traceback" not in err
    # A certificate without its key is a usage error before anything is opened.
    assert main(["log", "dump", "--data-dir", where, *flags[:4]]) == 2
    assert "--etcd-cert and --etcd-key go together" in capsys.readouterr().err


def test_the_flags_and_their_environment_variables(tmp_path: Path) -> None:
    ca, cert, key = (tmp_path / n for n in ("ca.pem", "c.pem", "k.pem"))
    for f in (ca, cert, key):
        f.write_text("x")

    class Args:
        etcd_cacert: Path | None = None
        etcd_cert: Path | None = None
        etcd_key: Path | None = None

    assert etcd_tls_from(Args(), environ={}, set_default=False) is None
    env = {ENV_CACERT: str(ca)}
    assert etcd_tls_from(Args(), environ=env, set_default=False) == EtcdTls(ca)
    a = Args()
    a.etcd_cacert, a.etcd_cert, a.etcd_key = ca, cert, key
    assert etcd_tls_from(a, environ={}) == EtcdTls(ca, cert, key)
    assert default_tls() == EtcdTls(ca, cert, key)  # the flags became the default
    a.etcd_key = None
    with pytest.raises(InvalidConfigurationError, match="go together"):
        etcd_tls_from(a, environ={}, set_default=False)
    a.etcd_cacert, a.etcd_key = None, key
    with pytest.raises(InvalidConfigurationError, match="needs --etcd-cacert"):
        etcd_tls_from(a, environ={}, set_default=False)
    a.etcd_cacert = tmp_path / "missing.pem"
    with pytest.raises(InvalidConfigurationError, match=r"missing\.pem does not exist"):
        etcd_tls_from(a, environ={}, set_default=False)


def test_a_local_cluster_keeps_the_scheme_it_first_started_with(
    tmp_path: Path, certs: Path
) -> None:
    tls = LocalEtcd(tmp_path / "tls", 1, tls_dir=etcd_dir(certs))
    tls.start()
    tls.stop()
    assert '"tls": true' in (tmp_path / "tls" / PORTS_FILE).read_text()
    with pytest.raises(InvalidConfigurationError, match="first started with TLS"):
        LocalEtcd(tmp_path / "tls", 1)
    plain = LocalEtcd(tmp_path / "plain", 1)
    plain.start()
    plain.stop()
    again = LocalEtcd(tmp_path / "plain", 1, tls_dir=etcd_dir(certs))
    assert again.kept_plaintext and again.tls_dir is None and again.client_tls() is None
    assert again.members[0].client_url.startswith("http://")


def test_a_controller_without_its_etcd_certificate_exits_with_a_named_error(
    tls_etcd: LocalEtcd, certs: Path, tmp_path: Path
) -> None:
    no_cert = [
        sys.executable, "-m", "controller", "--data-dir", str(tmp_path / "c"),
        "--listen", "127.0.0.1:0", "--metadata-log", url(tls_etcd), "--insecure",
        "--etcd-cacert", str(etcd_dir(certs) / CA_CERT),
    ]  # fmt: skip
    r = subprocess.run(no_cert, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 1, r.stderr
    assert "error: SSL_AUTHENTICATION_FAILED" in r.stderr and "Traceback" not in r.stderr


async def test_each_members_certificate_is_checked_against_its_own_host(
    tmp_path: Path,
) -> None:
    """A member whose certificate names only its own host ("localhost", not 127.0.0.1)
    behind a URL whose first endpoint is another host: the client checks that member
    against its own host, as etcdctl does, and reads from it (the first endpoint does
    not answer). Checking every member against the first endpoint's host refused it."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(tmp_path / "ca.pem")
    ca.issue_cert("localhost").private_key_and_cert_chain_pem.write_to_path(tmp_path / "m.pem")
    port, peer, closed = free_port(), free_port(), free_port()
    proc = subprocess.Popen(  # noqa: ASYNC220 (started once; the loop waits on it below)
        ["etcd", "--name", "m", "--data-dir", str(tmp_path / "data"),
         "--listen-client-urls", f"https://127.0.0.1:{port}",
         "--advertise-client-urls", f"https://localhost:{port}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"m=http://127.0.0.1:{peer}",
         "--cert-file", str(tmp_path / "m.pem"), "--key-file", str(tmp_path / "m.pem")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    tls = EtcdTls(tmp_path / "ca.pem")
    target = EtcdTarget.parse(f"etcd://127.0.0.1:{closed},localhost:{port}/names", tls=tls)
    try:
        async with asyncio.timeout(30):
            while True:  # until the member serves (no member: StoreUnavailableError)
                try:
                    client = await Etcd.connect(target, timeout_s=2.0)
                    break
                except SslAuthenticationError:
                    raise
                except MetactlError:
                    await asyncio.sleep(0.1)  # polling a starting process
        try:
            kv, _ = await client.get(target.key("meta"))
            assert kv is None and client.member == f"localhost:{port}"
        finally:
            await client.close()
    finally:
        proc.terminate()
        proc.wait()
