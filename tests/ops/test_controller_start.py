"""`metactl controller start` on a single-controller `cluster up` (SQLite), as real
processes: the controller killed with -9 is reported with how to bring it back, and
`controller start --node-id c1` brings it back on its address, active again, with the
brokers reaching it (the demo topic is described through it). The quorum case (a
standby back on etcd) is tests/e2e/test_failover_visible.py."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.ops.test_cluster_supervision import pids, read_until
from tests.ops.test_cluster_up import Up, metactl

pytestmark = pytest.mark.slow


def test_a_killed_single_controller_comes_back_active(tmp_path: Path) -> None:
    data = tmp_path / "data"
    up = Up(data, "--insecure", "--no-events")
    try:
        children = pids(up.await_banner())
        record = json.loads((data / "cluster-up.json").read_text())
        (only,) = record["controller_processes"].values()
        assert only["node_id"] == "c1"
        os.kill(children["controller"], signal.SIGKILL)
        hint = f"controller start --node-id c1 --data-dir {data.resolve()}"
        lines = read_until(up, hint)
        assert any("!! controller (pid " in x for x in lines), lines
        r = metactl("controller", "start", "--node-id", "c1", "--data-dir", str(data), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("Controller c1 started (pid "), r.stdout
        assert f"listen {only['listen']}" in r.stdout and "role active" in r.stdout, r.stdout
        read_until(up, "controller started again by `metactl controller start`")
        r = metactl("describe", "--bootstrap-controller", only["listen"], "--insecure",
                    cwd=tmp_path)  # fmt: skip
        assert r.returncode == 0 and "Topic: demo" in r.stdout, r.stderr
        again = json.loads((data / "cluster-up.json").read_text())
        assert again["controller_processes"]["1"]["pid"] != children["controller"]
        r = metactl("controller", "start", "--node-id", "c2", "--data-dir", str(data), cwd=tmp_path)
        assert r.returncode == 2 and "runs controllers c1: there is no" in r.stderr, r.stderr
    finally:
        status = up.stop()
    assert status == 0
