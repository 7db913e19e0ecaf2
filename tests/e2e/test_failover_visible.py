"""A controller failover is visible, and a dead controller comes back (issue 33, item 4),
as real processes: `metactl cluster up --controllers 3 --etcd 3 --no-events` and a
`metactl events --follow` given only the active controller's address.

The active controller is SIGKILLed. The follow, whose controller it was, goes on at
another one and prints the new term's line ("controller cM active (term T2); cN lost it (dead-active
detection)") once, with a larger term than the dead one's; `cluster up`'s pane says
"controller M is active now (term T2); controller N lost it (...)" without its event
feed, and tells how to bring the dead one back. `metactl controller start --node-id cN`
brings it back, supervised, as a standby (`metactl quorum describe` says so), on the
addresses it had; the refusals are named. How long the line took after the kill is
printed (the issue's "within 2 s" is a bench figure), never asserted.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.cluster import free_block
from tests.ops.test_cluster_supervision import pids
from tests.ops.test_cluster_up import CLI, REPO, Up, env, metactl

pytestmark = pytest.mark.slow

BOUND_S = 120.0  # bounds a hang on a loaded machine; nothing is timed against it
FIRST = re.compile(r"controller (c\d) active \(term (\d+)\)$")
CHANGE = re.compile(r"controller (c\d) active \(term (\d+)\); (c\d) lost it \((.+)\)$")
ENDED = {"dead-active detection", "lease expired"}  # how a killed holder's term can end


class Lines:
    """A process's stdout, line by line, read by a thread of its own (a wait is bounded)."""

    def __init__(self, stream: object) -> None:
        self.q: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []

        def read() -> None:
            for line in stream:  # type: ignore[attr-defined]
                self.q.put(line.rstrip("\n"))
            self.q.put(None)

        threading.Thread(target=read, daemon=True).start()

    def until(self, found: Callable[[list[str]], bool], what: str) -> list[str]:
        deadline = time.monotonic() + BOUND_S
        while not found(self.seen):
            try:
                line = self.q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {what} within {BOUND_S:.0f} s: {self.seen}") from None
            if line is None:
                raise AssertionError(f"the output ended without {what}: {self.seen}")
            self.seen.append(line)
        return self.seen


def matches(pattern: re.Pattern[str], lines: list[str]) -> list[re.Match[str]]:
    return [m for line in lines if (m := pattern.search(line)) is not None]


def test_a_killed_active_controller_shows_and_comes_back_as_a_standby(tmp_path: Path) -> None:
    data = tmp_path / "data"
    up = Up(data, "--insecure", "--controllers", "3", "--etcd", "3", "--no-events",
            "--listen", f"127.0.0.1:{free_block(3)}")  # fmt: skip
    follow: subprocess.Popen[str] | None = None
    try:
        banner = up.await_banner()
        children = pids(banner)
        record = json.loads((data / "cluster-up.json").read_text())
        addresses = {
            info["node_id"]: info["listen"] for info in record["controller_processes"].values()
        }
        assert set(addresses) == {"c1", "c2", "c3"}
        # The pane says who is active once it has read the log (without the feed).
        pane = Lines(up.proc.stdout)
        pane.until(lambda seen: any(" is active (term " in x for x in seen), "the active line")
        active = re.search(r"controller (\d) is active \(term (\d+)\)", "\n".join(pane.seen))
        assert active is not None, pane.seen
        old, old_term = f"c{active.group(1)}", int(active.group(2))

        # Given only the active controller, the one to be killed: it learns the others
        # from it, and goes on at one of them when it dies.
        follow = subprocess.Popen(
            [*CLI, "events", "--follow", "--since", "1d", "--insecure",
             "--bootstrap-controller", addresses[old]],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env(),
            start_new_session=True,
        )  # fmt: skip
        events = Lines(follow.stdout)
        events.until(
            lambda seen: (old, str(old_term)) in [m.groups() for m in matches(FIRST, seen)],
            f"{old}'s term {old_term}",
        )

        killed = time.monotonic()
        os.kill(children[f"controller {old[1:]}"], signal.SIGKILL)
        seen = events.until(lambda seen: bool(matches(CHANGE, seen)), "the new term's line")
        took = time.monotonic() - killed
        ((new, term, lost, why),) = [m.groups() for m in matches(CHANGE, seen)]
        assert new != old and lost == old, seen
        assert int(term) > old_term, seen
        assert why in ENDED, seen
        print(f"\nfailover visible: {old} killed -> `events --follow` printed {new}'s term "
              f"{took:.2f} s later ({why})")  # fmt: skip

        # The pane: the new active controller, and how to bring the dead one back.
        pane_line = (
            f"controller {new[1:]} is active now (term {term}); controller {old[1:]} lost it "
            f"({why})"
        )
        hint = f"controller start --node-id {old} --data-dir {data.resolve()}"
        pane.until(
            lambda seen: any(pane_line in x for x in seen) and any(hint in x for x in seen),
            "the pane's active line and the hint",
        )
        assert any(f"!! controller {old[1:]} (pid " in x for x in pane.seen), pane.seen

        # Brought back: supervised by cluster up, a standby, on the address it had.
        r = metactl("controller", "start", "--node-id", old, "--data-dir", str(data), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(f"Controller {old} started (pid "), r.stdout
        assert f"listen {addresses[old]}" in r.stdout and "role standby" in r.stdout, r.stdout
        pane.until(
            lambda seen: any(f"controller {old[1:]} started again by" in x for x in seen),
            "the pane's restart line",
        )
        r = metactl("quorum", "describe", "--status", "--json", "--insecure",
                    "--bootstrap-controller", addresses[old], cwd=tmp_path)  # fmt: skip
        assert r.returncode == 0, r.stderr
        quorum = json.loads(r.stdout)
        roles = {c.get("node_id"): c["role"] for c in quorum["controllers"]}
        assert roles[old] == "standby" and roles[new] == "active", quorum
        assert quorum["leader"]["id"] == new and quorum["leader"]["term"] == int(term)

        # Refusals, named: it runs now; no such node; no cluster up there.
        r = metactl("controller", "start", "--node-id", old, "--data-dir", str(data), cwd=tmp_path)
        assert r.returncode == 1, r.stderr
        assert r.stderr.startswith(f"error: INVALID_REQUEST: controller {old[1:]} is running")
        r = metactl("controller", "start", "--node-id", "c9", "--data-dir", str(data), cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.startswith("error: INVALID_CONFIG: "), r.stderr
        assert "c1, c2, c3" in r.stderr
        r = metactl("controller", "start", "--node-id", old, "--data-dir", str(tmp_path),
                    cwd=tmp_path)  # fmt: skip
        assert r.returncode == 5 and "no `metactl cluster up` is running" in r.stderr, r.stderr

        # Each term told once by the follow: no line twice.
        terms = [x for x in events.seen if FIRST.search(x) or CHANGE.search(x)]
        assert len(terms) == len(set(terms)), terms
    finally:
        if follow is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(follow.pid, signal.SIGINT)
            try:
                follow.wait(timeout=30)
            finally:
                if follow.poll() is None:
                    os.killpg(follow.pid, signal.SIGKILL)
                    follow.wait()
        status = up.stop()
    assert status == 0
