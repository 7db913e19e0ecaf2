"""`metactl cluster up` (what `make run` runs), as real processes: it makes the cluster's
certificates, runs everything with mutual TLS, and the CLI commands it prints work as
printed. A viewer may describe but not create; a plaintext or foreign-CA client is
refused with a named error; /metrics needs a client certificate. Ctrl-C stops it all."""

from __future__ import annotations

import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster.certs import default_names, init_certs
from protocol.flags import ENV_TLS_DIR
from protocol.tls import CA_CERT, CA_KEY
from tests.e2e.cluster import free_block, free_port
from tests.observability.kit import scrape_context

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "ops.cli"]


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k != ENV_TLS_DIR}
    e["PYTHONPATH"] = str(REPO)
    return e


def metactl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, cwd=cwd, env=env(), timeout=60, check=False
    )


class Up:
    def __init__(self, data: Path, *extra: str) -> None:
        self.data = data
        # Every port fixed and free below the ephemeral range (tests.e2e.cluster's): a
        # port the kernel picks (0) may be taken by another connection by the time a
        # killed process is started again on its recorded port (`broker start`). /metrics
        # on 16 ports from the block's base (controllers, then brokers); Kafka listeners
        # on a block of 101 (brokers from its base, controllers 100 above), or none.
        kafka = [] if "--no-kafka" in extra else ["--kafka-base-port", str(free_block(101))]
        # etcd's ports too (cluster up's default, 12379 and up, is one block for every run).
        if "--etcd" in extra and "--etcd-base-port" not in extra:
            kafka += ["--etcd-base-port", str(free_block(18))]
        self.proc = subprocess.Popen(
            [*CLI, "cluster", "up", "--brokers", "1", "--data-dir", str(data),
             "--listen", f"127.0.0.1:{free_port()}", "--metrics",
             f"127.0.0.1:{free_block(16)}", *kafka,
             "--partitions", "2", "--min-isr", "1", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env(),
            start_new_session=True,
        )  # fmt: skip
        self.banner: list[str] = []
        self._lines: queue.Queue[str | None] | None = None

    def await_banner(self) -> list[str]:
        """Its output up to 'Ctrl-C stops everything cleanly.' (the test's timeout bounds
        the wait)."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.banner.append(line.rstrip("\n"))
            if line.startswith("Ctrl-C stops"):
                return self.banner
        _, err = self.proc.communicate(timeout=30)
        raise AssertionError(f"cluster up exited {self.proc.returncode}: {err}")

    def lines(self) -> queue.Queue[str | None]:
        """What it prints from now on (after `await_banner`), line by line and None at its
        end, read by a thread of its own so that a wait for a line can be bounded."""
        if self._lines is None:
            lines: queue.Queue[str | None] = queue.Queue()
            stdout = self.proc.stdout
            assert stdout is not None

            def read() -> None:
                for line in stdout:
                    lines.put(line)
                lines.put(None)

            threading.Thread(target=read, daemon=True).start()
            self._lines = lines
        return self._lines

    def command(self, name: str) -> list[str]:
        """The printed `metactl <name> ...` suggestion, as arguments."""
        for line in self.banner:
            words = shlex.split(line.split(":", 1)[1] if line.startswith("  try:") else line)
            # The banner names this environment's metactl by its full path.
            if len(words) > 1 and Path(words[0]).name == "metactl" and words[1] == name:
                assert Path(words[0]).is_absolute() and Path(words[0]).exists(), words[0]
                return words[1:]
        raise AssertionError(f"no `metactl {name}` line in {self.banner}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
        try:
            return self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    u = Up(tmp_path / "data")
    try:
        yield u
    finally:
        u.stop()


def test_cluster_up_runs_mutual_tls_and_prints_working_commands(up: Up, tmp_path: Path) -> None:
    banner = up.await_banner()
    certs = (tmp_path / "data" / "certs").resolve()
    assert banner[0] == f"certificates: created controller, admin, viewer, broker-1 in {certs}"
    assert any(f"export {ENV_TLS_DIR}={certs}" in line for line in banner)

    # The describe it prints works as printed (from anywhere: it names the certificates).
    describe = up.command("describe")
    assert "--tls-dir" in describe
    r = metactl(*describe, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\tTopic: demo\tPartition: ") == 2  # two partition lines
    # So does the viewer's brokers; the viewer may not create a topic.
    brokers = up.command("brokers")
    assert brokers[-2:] == ["--principal", "viewer"]
    r = metactl(*brokers, cwd=tmp_path)
    assert r.returncode == 0 and "   1 " in r.stdout, r.stderr
    address = describe[describe.index("--bootstrap-controller") + 1]
    viewer = ["--controller", address, "--tls-dir", str(certs), "--principal", "viewer"]
    r = metactl("topics", "create", "--topic", "x", "--partitions", "1", *viewer, cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.startswith("error: TOPIC_AUTHORIZATION_FAILED")
    # The environment variable stands in for --tls-dir.
    r = subprocess.run(
        [*CLI, "describe", "--controller", address, "--json"],
        capture_output=True,
        check=False,
        text=True,
        cwd=tmp_path,
        env={**env(), ENV_TLS_DIR: str(certs)},
        timeout=60,
    )
    assert r.returncode == 0 and '"topic":"demo"' in r.stdout.replace(" ", ""), r.stderr

    # Plaintext, or another cluster's certificates: refused, with a named error.
    r = metactl("describe", "--controller", address, "--insecure", cwd=tmp_path)
    assert r.returncode == 5 and r.stderr.startswith("error: NETWORK_EXCEPTION"), r.stderr
    other = tmp_path / "other"
    init_certs(other, default_names([]))
    r = metactl("describe", "--controller", address, "--tls-dir", str(other), cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.startswith("error: SSL_AUTHENTICATION_FAILED")
    for err in (r.stderr,):
        assert "Traceback" not in err

    # /metrics: HTTPS with a client certificate of the cluster CA.
    url = next(w for line in banner for w in line.split() if w.startswith("https://"))
    with urllib.request.urlopen(url, timeout=10, context=scrape_context(certs, "viewer")) as m:
        assert b"metactl_brokers" in m.read()

    # Ctrl-C stops everything cleanly.
    assert up.stop() == 0


def test_a_second_run_keeps_the_ca_and_insecure_runs_plaintext(tmp_path: Path) -> None:
    data = tmp_path / "data"
    certs = data / "certs"
    init_certs(certs, default_names([]))  # as a first run (or `certs init`) left it
    ca = (certs / CA_CERT).read_bytes(), (certs / CA_KEY).read_bytes()
    first = Up(data)
    try:
        banner = first.await_banner()
        assert banner[0] == f"certificates: created broker-1 in {certs.resolve()}"
    finally:
        assert first.stop() == 0
    assert ((certs / CA_CERT).read_bytes(), (certs / CA_KEY).read_bytes()) == ca

    plain = Up(data, "--insecure")
    try:
        banner = plain.await_banner()
        assert not banner[0].startswith("certificates:")
        assert any("security: none (--insecure)" in line for line in banner)
        describe = plain.command("describe")
        assert describe[-1] == "--insecure"
        r = metactl(*describe, cwd=tmp_path)
        assert r.returncode == 0 and "Topic: demo" in r.stdout, r.stderr
    finally:
        assert plain.stop() == 0
