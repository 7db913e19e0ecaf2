"""Bringing a broker back, and what `cluster up` prints about its children (issue 22),
as real processes.

* `metactl broker start --id N --data-dir D` (the README walkthrough's step after `kill
  -9`): the running `cluster up` starts broker N again with the command line it recorded
  in D/cluster-up.json; it registers again, the feed says so, `cluster up` supervises it
  (Ctrl-C stops it in order, with a controlled shutdown). Refusals: a broker that runs,
  an id the cluster does not have, no cluster up on D.
* Every broker serves /metrics on a port the banner prints, and D/prometheus.yml scrapes
  the controller and every broker (item 11).
* A child that cannot start (a busy /metrics port, the controller's or a broker's) fails
  `cluster up` with one readable line, then the end of its log rendered readably: never
  its raw JSON lines (item 3).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from localcluster.control import RECORD_FILE
from tests.observability.kit import scrape_context
from tests.ops.test_cluster_supervision import assert_stopped_in_order, pids, read_until
from tests.ops.test_cluster_up import CLI, REPO, Up, env, free_port, metactl

pytestmark = pytest.mark.slow

BOUND_S = 60.0


def active(up: Up, broker: int, certs: Path) -> bool:
    describe = up.command("describe")
    address = describe[describe.index("--bootstrap-controller") + 1]
    r = metactl("brokers", "--controller", address, "--tls-dir", str(certs), "--json", cwd=REPO)
    assert r.returncode == 0, r.stderr
    found = re.search(rf'"broker_id":\s*{broker},[^}}]*"fenced":\s*(true|false)', r.stdout)
    return found is not None and found.group(1) == "false"


def test_a_killed_broker_comes_back_with_broker_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    up = Up(data, "--brokers", "3", "--metrics", "127.0.0.1:0")
    try:
        banner = up.await_banner()
        certs = (data / "certs").resolve()
        # Item 11: every broker's /metrics in the banner, and a Prometheus config for all.
        line = next(x for x in banner if x.strip().startswith("brokers 1: https://"))
        urls = dict(re.findall(r"(\d): (https://\S+/metrics)", line))
        assert set(urls) == {"1", "2", "3"}
        with urllib.request.urlopen(
            urls["2"], timeout=10, context=scrape_context(certs, "viewer")
        ) as m:
            assert b"metactl_broker_metadata_lag_records" in m.read()
        config = data.resolve() / "prometheus.yml"
        assert any(f"prometheus --config.file={config}" in x for x in banner)
        doc = yaml.safe_load(config.read_text())
        jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
        brokers = jobs["metactl-brokers"]["static_configs"][0]["targets"]
        assert sorted(brokers) == sorted(u.split("/")[2] for u in urls.values())
        assert jobs["metactl-brokers"]["tls_config"]["cert_file"].endswith("viewer.pem")
        assert len(jobs["metactl-controller"]["static_configs"][0]["targets"]) == 1
        if shutil.which("promtool"):
            check = subprocess.run(
                ["promtool", "check", "config", str(config)],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert check.returncode == 0, check.stdout + check.stderr

        # The walkthrough: kill -9 a broker, watch it fenced, bring it back.
        children = pids(banner)
        os.kill(children["broker 2"], signal.SIGKILL)
        lines = read_until(up, "broker 2 fenced")
        hint = f"broker start --id 2 --data-dir {data.resolve()}"
        assert any(hint in x for x in lines), lines  # the death report says how
        recorded = (data / RECORD_FILE).read_text()
        assert '"--id",\n        "2"' in recorded
        r = metactl("broker", "start", "--id", "2", "--data-dir", str(data), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("Broker 2 started (pid ")
        new_pid = int(r.stdout.split("(pid ", 1)[1].split(";", 1)[0])
        assert new_pid != children["broker 2"]
        lines = read_until(up, "broker 2 registered")
        assert any("broker 2 started again by `metactl broker start`" in x for x in lines)
        assert "UNCLEAN restart" in lines[-1]  # a kill -9 leaves no clean-shutdown file
        deadline = time.monotonic() + BOUND_S
        while not active(up, 2, certs):
            assert time.monotonic() < deadline, "broker 2 never became active again"
            time.sleep(0.2)  # polling the cluster's state
        # It serves /metrics where it did (Prometheus's target still holds).
        with urllib.request.urlopen(
            urls["2"], timeout=10, context=scrape_context(certs, "viewer")
        ) as m:
            assert b'metactl_broker_epoch{broker="2"}' in m.read()

        # Refusals: it runs now; no broker 7 here; no cluster up on another directory.
        r = metactl("broker", "start", "--id", "2", "--data-dir", str(data), cwd=tmp_path)
        assert r.returncode == 1, r.stderr
        assert r.stderr.startswith(f"error: INVALID_REQUEST: broker 2 is running (pid {new_pid})")
        r = metactl("broker", "start", "--id", "7", "--data-dir", str(data), cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.startswith("error: INVALID_CONFIG: "), r.stderr
        r = metactl("broker", "start", "--id", "1", "--data-dir", str(tmp_path), cwd=tmp_path)
        assert r.returncode == 5 and "no `metactl cluster up` is running" in r.stderr
    finally:
        status = up.stop()
    assert status == 0
    # Ctrl-C stopped the restarted broker too: a controlled shutdown, before the controller.
    assert_stopped_in_order(data, [1, 2, 3])
    assert not (data / "cluster.sock").exists()


def busy_pair(who: str) -> tuple[socket.socket, int]:
    """A listening socket on the port `who` will want, and the --metrics to give: for
    broker 1, a free port P for the controller and P+1 held."""
    for _ in range(50):
        busy = socket.create_server(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        if who == "controller":
            return busy, port
        busy.close()
        try:
            return socket.create_server(("127.0.0.1", port + 1)), port
        except OSError:
            continue  # P+1 is taken: another pair
    raise AssertionError("no pair of free ports")


@pytest.mark.parametrize("who", ["controller", "broker 1"])
def test_a_busy_metrics_port_is_refused_before_anything_starts(who: str, tmp_path: Path) -> None:
    """A port of `cluster up`'s held by a listener is found before any process starts
    (`localcluster.ports`): one line naming the port, whose it is, what holds it and the
    flag that moves it; no child was started (a child that fails anyway, a port taken
    in between, is tests/ops/test_cluster_supervision.py's)."""
    # The controller's /metrics is --metrics; broker 1's the next port.
    busy, metrics = busy_pair(who)
    port = busy.getsockname()[1]
    try:
        r = subprocess.run(
            [*CLI, "cluster", "up", "--data-dir", str(tmp_path / "data"), "--insecure",
             "--brokers", "1", "--listen", f"127.0.0.1:{free_port()}",
             "--metrics", f"127.0.0.1:{metrics}", "--kafka-base-port", "0"],
            capture_output=True, text=True, cwd=REPO, env=env(), timeout=BOUND_S, check=False,
        )  # fmt: skip
    finally:
        busy.close()
    assert r.returncode == 1, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, lines
    whose = "the controller's" if who == "controller" else "broker 1's"
    assert lines[0].startswith(f"error: LISTEN_FAILED: 127.0.0.1:{port} ({whose} "), lines[0]
    assert "another process listens on it" in lines[0] and "move it with --metrics" in lines[0]
    assert metrics in (port, port - 1)
    assert not list((tmp_path / "data" / "logs").glob("*.log"))  # nothing was started
    assert "Traceback" not in r.stderr
