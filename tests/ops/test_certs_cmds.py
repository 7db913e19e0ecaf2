"""`metactl certs init`: the CA survives re-runs, new names are added and signed by it,
and bad input is a named error without a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509

from ops.cli import main
from protocol.tls import CA_CERT, CA_KEY, TlsIdentity


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["certs", "init", *args])
    out, err = capsys.readouterr()
    return status, out, err


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_init_twice_keeps_the_ca_and_adds_new_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run(capsys, "--data-dir", str(tmp_path), "--brokers", "1,2,3")
    certs = tmp_path / "certs"
    assert status == 0
    assert "CA:       ca.pem (created)" in out
    assert "created:  controller, admin, viewer, broker-1, broker-2, broker-3" in out
    assert f"--tls-dir {certs.resolve()}" in out
    ca, ca_key = (certs / CA_CERT).read_bytes(), (certs / CA_KEY).read_bytes()
    controller = (certs / "controller.pem").read_bytes()
    assert (certs / CA_KEY).stat().st_mode & 0o777 == 0o600

    status, out, _ = run(capsys, "--data-dir", str(tmp_path), "--brokers", "1,2,3,4")
    assert status == 0
    assert "CA:       ca.pem (kept)" in out
    assert "created:  broker-4" in out
    assert "kept:     controller, admin, viewer, broker-1, broker-2, broker-3" in out
    assert (certs / CA_CERT).read_bytes() == ca and (certs / CA_KEY).read_bytes() == ca_key
    assert (certs / "controller.pem").read_bytes() == controller
    # The new broker's certificate is signed by the kept CA and names broker-4.
    new = load(certs / "broker-4.pem")
    new.verify_directly_issued_by(load(certs / CA_CERT))
    assert new.subject.rfc4514_string() == "CN=broker-4"
    TlsIdentity.from_dir(certs, "broker-4").client_context()  # loads as an identity

    status, out, _ = run(capsys, "--data-dir", str(tmp_path), "--brokers", "4")
    assert status == 0 and "created:  nothing" in out


@pytest.mark.parametrize("brokers", ["x", "1,,2", "-1", "1,2147483648", ""])
def test_bad_broker_ids_are_a_named_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], brokers: str
) -> None:
    status, out, err = run(capsys, "--data-dir", str(tmp_path), "--brokers", brokers)
    assert status == 2 and out == ""
    assert err.startswith("error: INVALID_CONFIG: --brokers takes broker ids")
    assert "Traceback" not in err
    assert not (tmp_path / "certs").exists()


def test_half_a_ca_is_a_named_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / CA_CERT).write_text("not a CA")
    status, _, err = run(capsys, "--data-dir", str(tmp_path))
    assert status == 2  # INVALID_CONFIG: the usage status of docs/cli.md's table
    assert err.startswith("error: INVALID_CONFIG:") and "half a CA" in err
    assert "Traceback" not in err


def test_an_unwritable_directory_is_a_named_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the data directory should be")
    status, _, err = run(capsys, "--data-dir", str(blocker))
    assert status == 2
    assert err.startswith("error: INVALID_CONFIG: cannot write certificates in")
    assert "Traceback" not in err
