"""`metactl cluster up --controllers 3 --etcd 3` restarted on one data directory, again
and again, while another process holds connections on loopback (issue 33, item 3: "20
of 20 restarts"). Prints how many restarts got ready and the seconds per restart;
asserts nothing.

Each round is one `cluster up ... --no-events --exit-after-ready` (the real CLI as a
subprocess: it starts etcd, the controllers and the brokers, creates the demo topic, then
stops everything in order and exits 0). The first start chooses the etcd ports and keeps
them in DATA_DIR/etcd/ports.json; every restart reuses them. The other ports come from
free blocks below the kernel's ephemeral range (tests/e2e/cluster.py's `free_block`).

``--occupy`` runs a second process (this script, ``--occupier``) that holds
connections on loopback: a pool of outgoing connections on ports the kernel chooses,
opened and closed all along (each close leaves a TIME-WAIT), and, before each restart,
one outgoing connection on every kept etcd port that the kernel could give an outgoing
connection, i.e. that is in its ephemeral range (ip_local_port_range), left in
``--occupy-state`` (TIME-WAIT by default, or FIN-WAIT-2 or ESTABLISHED: what `ss` showed
in the issue). Such a connection is made as the kernel's own are, without SO_REUSEADDR
(the socket is bound with it, to get past the TIME-WAITs of the old members' accepted
connections, and it is cleared before connecting: the kernel looks at the flag as it is
when a listener binds). A port outside that range is left alone: no outgoing
connection is ever given it. So with the default ports (--etcd-base-port 12379 and up)
nothing of etcd's is held; with ``--etcd-base-port 0`` (free ports, the old layout) or an
older tree (``--tree``, e.g. ``git archive HEAD | tar -x -C /tmp/old``) all of them are.

``--experiment`` prints instead what Linux does with a listener's bind on a port a
connection holds (the measurement behind `localcluster.ports`): for each way of holding
127.0.0.1:P, a plain bind, a bind with SO_REUSEADDR, bind and listen with it, and a real
etcd member with its client URL on P (Go sets SO_REUSEADDR on its listeners).

Run: python bench/cluster_restart.py [--restarts 20] [--controllers 3] [--etcd 3]
[--brokers 1] [--occupy] [--occupy-state time-wait|fin-wait-2|established]
[--etcd-base-port PORT] [--tree DIR] [--experiment]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import select
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from localcluster.ports import ephemeral_range, sockets_on  # noqa: E402
from tests.e2e.cluster import free_block  # noqa: E402

LO = "127.0.0.1"
RUN_TIMEOUT_S = 300.0  # one cluster up, start to exit (a bound on a hang; nothing timed)
POOL = 50  # the occupier's outgoing connections on ports the kernel chooses
CHURN_S = 0.1  # one of them closed (client first: a TIME-WAIT) and opened again this often


def clean_env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("METACTL_")}
    env["PYTHONPATH"] = str(tree)
    return env


# --- the occupier: another process holding connections on loopback ------------------------


class Occupier:
    """Runs in its own process (``--occupier STATE``); told on stdin ``occupy P ...``,
    ``release`` or ``quit``, it answers one line each on stdout."""

    def __init__(self, state: str) -> None:
        self.state = state
        self.server = socket.socket()
        self.server.bind((LO, 0))
        self.server.listen(512)
        self.held: list[socket.socket] = []
        self.pool: list[tuple[socket.socket, socket.socket]] = []
        self.stop = threading.Event()
        self.churned = 0

    def pair(self, client: socket.socket) -> socket.socket:
        client.connect(self.server.getsockname())
        accepted, _ = self.server.accept()
        return accepted

    def churn(self) -> None:
        """Outgoing connections on kernel-chosen ports, one replaced every CHURN_S."""
        while not self.stop.wait(CHURN_S):
            with contextlib.suppress(OSError):
                if len(self.pool) >= POOL:
                    client, accepted = self.pool.pop(0)
                    client.close()  # the client closes first: its port in TIME-WAIT
                    accepted.close()
                client = socket.socket()
                self.pool.append((client, self.pair(client)))
                self.churned += 1

    def hold(self, port: int) -> str:
        low, high = ephemeral_range()
        if not low <= port <= high:
            return "outside the ephemeral range"
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            client.bind((LO, port))
        except OSError:
            client.close()
            return "held already"
        client.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)  # as the kernel's own
        accepted = self.pair(client)
        if self.state == "established":
            self.held += [client, accepted]
        elif self.state == "fin-wait-2":
            client.close()  # orphaned in FIN-WAIT-2 while the peer keeps its end open
            self.held.append(accepted)
        else:
            client.close()
            accepted.recv(1)
            accepted.close()  # the client's end in TIME-WAIT, for the kernel's 60 s
        for _ in range(100):
            states = {s.state for s in sockets_on(LO, port) if s.local.endswith(f":{port}")}
            if states & {"TIME-WAIT", "FIN-WAIT-2", "ESTABLISHED"}:
                return "/".join(sorted(states))
            time.sleep(0.01)  # the peer's FIN on its way
        return "?"

    def release(self) -> None:
        """Every connection it holds reset (SO_LINGER 0: gone at once, no TIME-WAIT)."""
        for s in self.held:
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()
        self.held.clear()

    def serve(self) -> None:
        threading.Thread(target=self.churn, daemon=True).start()
        print("ready", flush=True)
        for line in sys.stdin:
            words = line.split()
            if not words or words[0] == "quit":
                break
            if words[0] == "occupy":
                got = Counter(self.hold(int(p)) for p in words[1:])
                held = ", ".join(f"{n} {what}" for what, n in sorted(got.items()))
                print(f"etcd's ports: {held}; {len(self.pool)} more connections open, "
                      f"{self.churned} opened and closed so far", flush=True)  # fmt: skip
            elif words[0] == "release":
                self.release()
                print("released", flush=True)
        self.stop.set()
        self.release()


class OccupierProcess:
    def __init__(self, state: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--occupier", state],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.ask(None) == "ready"

    def ask(self, line: str | None, timeout_s: float = 30.0) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if line is not None:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready:
            raise RuntimeError(f"the occupier did not answer {line!r}")
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.ask("quit", 1.0)
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait()


# --- the restarts -----------------------------------------------------------------------


@dataclass
class Run:
    ok: bool
    seconds: float
    waited: bool  # it said it waited for a closing connection
    why: str


def cluster_up(tree: Path, data: Path, args: argparse.Namespace, ports: dict[str, int]) -> Run:
    cmd = [sys.executable, "-m", "ops.cli", "cluster", "up", "--data-dir", str(data),
           "--controllers", str(args.controllers), "--etcd", str(args.etcd),
           "--brokers", str(args.brokers), "--listen", f"{LO}:{ports['listen']}",
           "--metrics", f"{LO}:{ports['metrics']}", "--kafka-base-port", str(ports["kafka"]),
           "--no-events", "--exit-after-ready"]  # fmt: skip
    if args.etcd_base_port is not None:
        cmd += ["--etcd-base-port", str(args.etcd_base_port)]
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=tree, env=clean_env(tree), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n(killed after {RUN_TIMEOUT_S:.0f} s)"
    seconds = time.monotonic() - started
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    why = (errors or err.strip().splitlines()[-1:] or [""])[0]
    return Run(proc.returncode == 0, seconds, "waiting up to" in out, why[:400])


def kept_ports(data: Path) -> list[int]:
    with contextlib.suppress(OSError, ValueError, KeyError):
        return [int(p) for p in json.loads((data / "etcd" / "ports.json").read_text())["ports"]]
    return []


def restarts(args: argparse.Namespace) -> None:
    tree = Path(args.tree).resolve() if args.tree else REPO
    low, high = ephemeral_range()
    print(
        f"cluster up --controllers {args.controllers} --etcd {args.etcd} --brokers "
        f"{args.brokers}: 1 first start + {args.restarts} restarts on one directory; tree "
        f"{tree}; etcd ports: "
        + ("default" if args.etcd_base_port is None else f"--etcd-base-port {args.etcd_base_port}")
        + f"; occupy: {args.occupy_state if args.occupy else 'no'}; ephemeral range {low}-{high}; "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True,
    )
    ports = {
        "listen": free_block(args.controllers),
        "metrics": free_block(args.controllers + args.brokers),
        "kafka": free_block(101 + args.controllers),
    }
    occupier = OccupierProcess(args.occupy_state) if args.occupy else None
    with tempfile.TemporaryDirectory(prefix="cluster-restart-") as d:
        data = Path(d) / "data"
        try:
            first = cluster_up(tree, data, args, ports)
            print(f"   first start: {'ok' if first.ok else 'FAILED'} in {first.seconds:.1f} s; "
                  f"etcd ports {kept_ports(data)} {first.why}", flush=True)  # fmt: skip
            if not first.ok:
                return
            runs: list[Run] = []
            for n in range(1, args.restarts + 1):
                held = ""
                if occupier is not None:
                    held = occupier.ask("occupy " + " ".join(map(str, kept_ports(data))))
                run = cluster_up(tree, data, args, ports)
                if occupier is not None:
                    occupier.ask("release")
                runs.append(run)
                print(f"   restart {n:>2}: {'ok' if run.ok else 'FAILED'} in {run.seconds:.1f} s"
                      + (" (waited for a closing connection)" if run.waited else "")
                      + (f"; {held}" if held else "")
                      + ("" if run.ok else f"; {run.why}"), flush=True)  # fmt: skip
        finally:
            if occupier is not None:
                occupier.close()
    ok = [r for r in runs if r.ok]
    secs = sorted(r.seconds for r in runs)
    p90 = secs[min(len(secs) - 1, int(0.9 * len(secs)))] if secs else 0.0
    print(
        f"   => restarts ok {len(ok)}, failed {len(runs) - len(ok)} (goal {len(runs)} of "
        f"{len(runs)}); waited for a closing connection {sum(r.waited for r in runs)}; "
        f"seconds per restart: median {statistics.median(secs) if secs else 0:.1f}, p90 "
        f"{p90:.1f}, max {max(secs, default=0):.1f}; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True,
    )


# --- the experiment ---------------------------------------------------------------------


def free_port() -> int:
    while True:
        p = random.randrange(20000, 32000)
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind((LO, p))
            return p


def try_bind(p: int, reuse: bool, listen: bool) -> str:
    with socket.socket() as s:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((LO, p))
            if listen:
                s.listen()
        except OSError as exc:
            return "IN USE" if exc.errno == 98 else f"FAIL({exc.strerror})"
        return "ok"


def try_etcd(p: int) -> str:
    d = tempfile.mkdtemp(prefix="etcd-bind-")
    peer = free_port()
    cmd = [shutil.which("etcd") or "/usr/bin/etcd", "--name", "x", "--data-dir", f"{d}/m",
           "--listen-client-urls", f"http://{LO}:{p}", "--advertise-client-urls", f"http://{LO}:{p}",
           "--listen-peer-urls", f"http://{LO}:{peer}",
           "--initial-advertise-peer-urls", f"http://{LO}:{peer}",
           "--initial-cluster", f"x=http://{LO}:{peer}"]  # fmt: skip
    with open(f"{d}/log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                text = Path(f"{d}/log").read_text(errors="replace")
                return "EXITS: in use" if "address already in use" in text else "EXITS"
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"http://{LO}:{p}/health", timeout=1) as r,
            ):
                if b"true" in r.read():
                    return "starts"
            time.sleep(0.1)  # polling another process's health
        return "not healthy"
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def listener() -> Iterator[socket.socket]:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((LO, free_port()))
        s.listen()
        yield s


Holder = Callable[[contextlib.ExitStack], int]


def outgoing(reuse: bool, then: str = "open") -> Holder:
    """An outgoing connection bound to P; `then`: left open, closed first by it with the
    peer's end open (FIN-WAIT-2), or closed by both (its end in TIME-WAIT)."""

    def hold(stack: contextlib.ExitStack) -> int:
        server = stack.enter_context(listener())
        p = free_port()
        client = socket.socket()
        if reuse:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        client.bind((LO, p))
        client.connect(server.getsockname())
        accepted = stack.enter_context(server.accept()[0])
        if then == "open":
            stack.enter_context(client)
        else:
            client.close()
            if then == "time-wait":
                accepted.recv(1)
                accepted.close()
        time.sleep(0.2)  # the FINs on their way
        return p

    return hold


def kernel_chosen(stack: contextlib.ExitStack) -> int:
    server = stack.enter_context(listener())
    client = stack.enter_context(socket.socket())
    client.connect(server.getsockname())
    stack.enter_context(server.accept()[0])
    return int(client.getsockname()[1])


def accepted_on(server_closes: bool) -> Holder:
    """P is an old listener's (SO_REUSEADDR), gone; a connection it accepted is left open,
    or was closed by the server first (its end in TIME-WAIT): a stopped etcd member's."""

    def hold(stack: contextlib.ExitStack) -> int:
        p = free_port()
        with socket.socket() as old:
            old.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            old.bind((LO, p))
            old.listen()
            client = socket.socket()
            client.connect((LO, p))
            accepted = old.accept()[0]
        if server_closes:  # the server first, then the client: the server's end in TIME-WAIT
            accepted.close()
            client.recv(1)
            client.close()
            time.sleep(0.2)
        else:
            stack.enter_context(accepted)
            stack.enter_context(client)
        return p

    return hold


def a_listener(stack: contextlib.ExitStack) -> int:
    return int(stack.enter_context(listener()).getsockname()[1])


def experiment() -> None:
    cases: list[tuple[str, Holder]] = [
        ("a listener (SO_REUSEADDR)", a_listener),
        ("outgoing, port chosen by the kernel, ESTABLISHED", kernel_chosen),
        ("outgoing, bound, no SO_REUSEADDR, ESTABLISHED", outgoing(False)),
        ("outgoing, bound, no SO_REUSEADDR, FIN-WAIT-2", outgoing(False, "fin-wait-2")),
        ("outgoing, bound, no SO_REUSEADDR, TIME-WAIT", outgoing(False, "time-wait")),
        ("outgoing, bound, SO_REUSEADDR, ESTABLISHED", outgoing(True)),
        ("outgoing, bound, SO_REUSEADDR, FIN-WAIT-2", outgoing(True, "fin-wait-2")),
        ("outgoing, bound, SO_REUSEADDR, TIME-WAIT", outgoing(True, "time-wait")),
        ("accepted by an old listener on P, ESTABLISHED", accepted_on(False)),
        ("accepted by an old listener on P, TIME-WAIT", accepted_on(True)),
    ]
    print(f"Linux {os.uname().release}; what a listener's bind on 127.0.0.1:P meets")
    print(f"{'P held by':50} {'state':12} {'plain bind':11} {'SO_REUSEADDR':13} "
          f"{'+ listen':9} etcd member")  # fmt: skip
    for name, hold in cases:
        with contextlib.ExitStack() as stack:
            p = hold(stack)
            states = sorted({s.state for s in sockets_on(LO, p) if s.local.endswith(f":{p}")})
            row = [try_bind(p, False, False), try_bind(p, True, False), try_bind(p, True, True)]
            print(f"{name:50} {'/'.join(states):12} {row[0]:11} {row[1]:13} {row[2]:9} "
                  f"{try_etcd(p)}", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--restarts", type=int, default=20, help="restarts after the first start")
    ap.add_argument("--controllers", type=int, default=3)
    ap.add_argument("--etcd", type=int, default=3)
    ap.add_argument("--brokers", type=int, default=1)
    ap.add_argument("--occupy", action="store_true", help="another process holds connections")
    ap.add_argument("--occupy-state", choices=("time-wait", "fin-wait-2", "established"),
                    default="time-wait")  # fmt: skip
    ap.add_argument("--etcd-base-port", type=int, default=None,
                    help="passed to cluster up (default: none, cluster up's own)")  # fmt: skip
    ap.add_argument("--tree", default=None, help="run the metactl of this tree (default: this)")
    ap.add_argument("--experiment", action="store_true", help="the bind experiment instead")
    ap.add_argument("--occupier", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.occupier:
        Occupier(args.occupier).serve()
    elif args.experiment:
        experiment()
    else:
        restarts(args)


if __name__ == "__main__":
    main()
