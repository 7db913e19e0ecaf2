"""The real processes of a chaos run: one controller (on a SQLite log) or, with
`--etcd M`, a local M-member etcd cluster (`localcluster.etcd.LocalEtcd`, as `metactl
cluster up --etcd` runs it) and `--controllers N` controllers on the one metadata log in
it (one active, the others hot standbys, docs/ha.md); and B brokers given every
controller. Each process in its own process group, started, signalled, restarted on its
own data directory and always stopped.

Ports are chosen once and kept across restarts (a broker knows the controllers by
address, and an etcd member's data remembers its peer URLs): free ones by default, or
from `--base-port P` on, in this order: each controller's listener and /metrics
(P, P+1 for the first, P+2, P+3 for the second, ...), then the etcd members' client and
peer ports (2 per member), then one listener per broker, then (with `--client
librdkafka`) one Kafka listener per broker (`port_plan`). A broker's Kafka listener
(`--kafka-listen`) is pinned even without `--base-port` (free ports chosen once): a
Kafka client bootstraps from those addresses and must find a restarted broker there.

Every process is started with `start_new_session=True`, so its process group id is its
pid and a terminal's Ctrl-C never reaches it directly; `stop_all` (always called from a
`finally`) resumes what is paused, asks everything to stop (SIGTERM, brokers first) and
SIGKILLs what is still alive after a grace period; `kill_all` SIGKILLs every group at once,
for when that orderly stop cannot finish (the run cancelled again while stopping). `pids`
lists every pid ever started, so that a caller can check none is left.

A controller or broker is started behind `dies_with_parent("SIGKILL")`, from the event
loop's thread: if the runner itself dies (SIGKILLed, as `subprocess.run(timeout=...)` or a
test's timeout does to a `chaos run` that overran), its controllers and brokers die with it
instead of running on as orphans. SIGKILL, not SIGTERM: a broker the run has paused
(SIGSTOP) would never act on a SIGTERM. (The etcd members get `LocalEtcd`'s own SIGTERM.)

A broker killed with page-cache loss is restarted with `--lose-unflushed`: the stub
broker applies that flag when it loads its replicas at start (it drops every replica's
data above its last fsynced offset), so a "lossy" kill is SIGKILL + a restart with the
flag, and a plain kill (the OS kept the page cache) is SIGKILL + a restart without it.

The controllers and brokers run with `--insecure` (plaintext, no principals): the chaos
runner's clients, its /metrics scrapes and its faults are about replication and recovery,
not authentication (`metactl cluster up` and tests/e2e run with mutual TLS). The etcd
cluster runs as `cluster up --etcd N` runs it by default: TLS with client
certificates (``--client-cert-auth``, `localcluster.etcd`), its CA and certificates made in
``<data dir>/certs/etcd`` (`localcluster.certs.init_etcd_certs`); each controller is given its etcd
certificate by flag (`controller_cmd`) and the runner's own etcd client the admin's
(`etcd_tls`). Flags and explicit certificates win over ``METACTL_ETCD_CACERT``/``_CERT``/
``_KEY``, so those variables in the environment change nothing here (before, the etcd ran
in plaintext and a ``METACTL_ETCD_CACERT`` made every controller speak TLS to it).

Which etcd member leads is asked of the members themselves (`etcd_leader`: the v3
gateway's maintenance status, whose `leader` names the leader's member id).

This module owns process lifecycles only: it must not decide which fault comes when
(`chaos.plan`, `chaos.faults`) or talk the metadata protocol (`chaos.runner`, `chaos.watch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from localcluster.certs import etcd_dir, init_etcd_certs
from localcluster.etcd import LocalEtcd, free_ports
from localcluster.procs import await_ready, start_process
from metactl.errors import InvalidConfigurationError
from metactl.processes import dies_with_parent
from metadata_log.etcd.tls import EtcdTls, tls_flags
from protocol.tls import ADMIN, CONTROLLER

READY_TIMEOUT_S = 60.0
ETCD_PREFIX = "metactl/chaos"
CLUSTER_ID = "chaos"
CERTS_DIR = "certs"  # under the run's data directory; the etcd ones in its etcd/


@dataclass(frozen=True, kw_only=True)
class Timing:
    """Short timeouts so that fences, elections and recoveries happen within seconds."""

    heartbeat_ms: int = 200
    session_ms: int = 1500
    flush_ms: int = 500
    replica_lag_ms: int = 1000
    recovery_window_ms: int = 500
    lease_ttl_s: int = 2  # the controllers' leadership lease on an etcd log


@dataclass(frozen=True)
class PortPlan:
    """Every port of a run: (listener, /metrics) per controller, the etcd base port (its
    members take 2 each from there; None: LocalEtcd picks free ones), and each broker's
    listener (port 0: a free one at each start)."""

    controllers: list[tuple[int, int]]
    etcd_base: int | None
    brokers: dict[int, int]
    kafka: dict[int, int] = field(default_factory=dict)  # broker -> Kafka listener port

    def kafka_bootstrap(self) -> str:
        """Every broker's Kafka address, comma-separated ('' without Kafka listeners)."""
        return ",".join(f"127.0.0.1:{port}" for _, port in sorted(self.kafka.items()))


def port_plan(
    base_port: int | None, *, controllers: int, etcd: int, brokers: int, kafka: bool = False
) -> PortPlan:
    """From `base_port` on (see the module docs), or free ports for the controllers
    (kept across their restarts) and any port for the brokers and etcd members; with
    `kafka`, a Kafka listener port per broker (after the brokers' listeners; free ones
    chosen once without `base_port`)."""
    if base_port is None:
        ports = free_ports(2 * controllers + (brokers if kafka else 0))
        pairs = [(ports[2 * i], ports[2 * i + 1]) for i in range(controllers)]
        kafka_ports = ports[2 * controllers :]
        return PortPlan(
            pairs,
            None,
            dict.fromkeys(range(1, brokers + 1), 0),
            {b: kafka_ports[b - 1] for b in range(1, brokers + 1)} if kafka else {},
        )
    total = 2 * controllers + 2 * etcd + brokers + (brokers if kafka else 0)
    if not 1024 <= base_port <= 65536 - total:
        per_broker = "2 per broker (listener, Kafka listener)" if kafka else "1 per broker"
        raise InvalidConfigurationError(
            f"--base-port {base_port}: the run needs the {total} ports from it "
            f"(2 per controller, 2 per etcd member, {per_broker}) within 1024..65535"
        )
    pairs = [(base_port + 2 * i, base_port + 2 * i + 1) for i in range(controllers)]
    etcd_base = base_port + 2 * controllers
    first_broker = etcd_base + 2 * etcd
    first_kafka = first_broker + brokers
    return PortPlan(
        pairs,
        etcd_base if etcd else None,
        {b: first_broker + b - 1 for b in range(1, brokers + 1)},
        {b: first_kafka + b - 1 for b in range(1, brokers + 1)} if kafka else {},
    )


def member_status(
    client_url: str, timeout_s: float = 1.0, context: ssl.SSLContext | None = None
) -> tuple[str, str] | None:
    """(its member id, the leader's member id) as an etcd member's v3 maintenance status
    says; the leader's is "0" while there is none; None: no answer within `timeout_s`."""
    req = urllib.request.Request(f"{client_url}/v3/maintenance/status", data=b"{}", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=context) as r:
            doc = json.loads(r.read())
        return str(doc["header"]["member_id"]), str(doc.get("leader", "0"))
    except (OSError, ValueError, KeyError, TypeError, urllib.error.URLError):
        return None


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[str] | None = None
    log_file: IO[str] | None = None
    state: str = "down"  # down | starting | up | paused | stopping

    @property
    def pid(self) -> int | None:
        return None if self.popen is None else self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.popen is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)

    async def wait_exit(self, timeout_s: float) -> int | None:
        p = self.popen
        if p is None:
            return None
        try:
            return await asyncio.to_thread(p.wait, timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def release(self) -> None:
        """Close the pipes of an exited process."""
        if self.popen is not None and self.popen.stdout is not None:
            self.popen.stdout.close()
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None


@dataclass
class Processes:
    root: Path
    brokers: int
    strategy: str
    elr: bool
    unclean_leader_election: bool
    ports: PortPlan
    etcd_members: int = 0  # 0: one controller on a SQLite log
    timing: Timing = field(default_factory=Timing)
    controllers: dict[int, Proc] = field(default_factory=dict)
    broker: dict[int, Proc] = field(default_factory=dict)
    etcd: LocalEtcd | None = None
    etcd_state: dict[int, str] = field(default_factory=dict)  # member index -> up|paused|down
    etcd_ids: dict[int, str] = field(default_factory=dict)  # member index -> member id
    pids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.ports.controllers)
        if n > 1 and not self.etcd_members:
            raise InvalidConfigurationError(
                f"{n} controllers need a shared log: add --etcd 3 (or 1)"
            )
        self.controllers = {
            i: Proc("controller" if n == 1 else f"controller-{i}") for i in range(1, n + 1)
        }
        self.broker = {i: Proc(f"broker-{i}") for i in range(1, self.brokers + 1)}
        if self.etcd_members:
            # The etcd CA and certificates (server, peer, controller, admin), as `cluster
            # up` makes them for `--etcd N`; kept if the directory already has them.
            certs = self.root / CERTS_DIR
            init_etcd_certs(certs)
            self.etcd = LocalEtcd(
                self.root / "etcd",
                self.etcd_members,
                base_port=self.ports.etcd_base,
                tls_dir=etcd_dir(certs),
                death_signal="SIGKILL",  # chaos pauses members: a stopped one ignores SIGTERM
            )

    # --- addresses ----------------------------------------------------------------------

    def address_of(self, i: int) -> str:
        return f"127.0.0.1:{self.ports.controllers[i - 1][0]}"

    def metrics_of(self, i: int) -> str:
        return f"127.0.0.1:{self.ports.controllers[i - 1][1]}"

    @property
    def address(self) -> str:
        """Every controller's HOST:PORT, comma-separated (kept across restarts)."""
        return ",".join(self.address_of(i) for i in self.controllers)

    @property
    def controller(self) -> Proc:
        """The first controller (the only one without --controllers)."""
        return self.controllers[1]

    @property
    def url(self) -> str | None:
        """The metadata log's etcd URL (None: SQLite)."""
        return None if self.etcd is None else self.etcd.url(ETCD_PREFIX)

    @property
    def etcd_tls(self) -> EtcdTls | None:
        """What the runner's own etcd client presents (the admin's etcd certificate);
        None: plaintext (no etcd, or one first started in plaintext). Pass it explicitly
        (`EtcdTarget.parse(url, tls=...)`): the process default would read METACTL_ETCD_*."""
        return None if self.etcd is None else self.etcd.client_tls(ADMIN)

    # --- commands -----------------------------------------------------------------------

    def controller_cmd(self, i: int) -> list[str]:
        t = self.timing
        name = self.controllers[i].name
        cmd = [
            sys.executable, "-m", "controller", "--data-dir", str(self.root / name),
            "--listen", self.address_of(i), "--metrics", self.metrics_of(i),
            "--heartbeat-interval-ms", str(t.heartbeat_ms),
            "--session-timeout-ms", str(t.session_ms),
            "--unclean-recovery-strategy", self.strategy,
            "--unclean-recovery-window-ms", str(t.recovery_window_ms),
            "--eligible-leader-replicas", "enabled" if self.elr else "disabled",
            "--insecure",
        ]  # fmt: skip
        if self.etcd is not None:
            cmd += [
                "--metadata-log", self.etcd.url(ETCD_PREFIX), f"--cluster-id={CLUSTER_ID}",
                "--node-id", f"c{i}", "--lease-ttl-s", str(t.lease_ttl_s),
                *tls_flags(self.etcd.client_tls(CONTROLLER)),
            ]  # fmt: skip
        if self.unclean_leader_election:
            cmd.append("--unclean-leader-election")
        return cmd

    def broker_cmd(self, broker_id: int, *, lose_unflushed: bool) -> list[str]:
        t = self.timing
        cmd = [
            sys.executable, "-m", "brokers_stub", "--id", str(broker_id),
            "--controller", self.address, "--data-dir", str(self.root / f"broker-{broker_id}"),
            "--listen", f"127.0.0.1:{self.ports.brokers[broker_id]}",
            "--heartbeat-interval-ms", str(t.heartbeat_ms),
            "--session-timeout-ms", str(t.session_ms),
            "--flush-interval-ms", str(t.flush_ms),
            "--replica-lag-time-max-ms", str(t.replica_lag_ms),
            "--insecure",
        ]  # fmt: skip
        if broker_id in self.ports.kafka:  # plaintext too: the brokers run --insecure
            cmd += ["--kafka-listen", f"127.0.0.1:{self.ports.kafka[broker_id]}"]
        if lose_unflushed:
            cmd.append("--lose-unflushed")
        return cmd

    # --- lifecycle ----------------------------------------------------------------------

    async def _launch(self, proc: Proc, cmd: list[str]) -> None:
        proc.release()
        # From the loop's thread, which lives as long as the run: see the module docs.
        proc.popen, proc.log_file = start_process(
            [*dies_with_parent("SIGKILL"), *cmd], self.root / "logs" / f"{proc.name}.log"
        )
        self.pids.append(proc.popen.pid)
        proc.state = "starting"
        try:
            await asyncio.to_thread(await_ready, proc.popen, proc.name, READY_TIMEOUT_S)
        except BaseException:
            # Not ready (or cancelled): do not leave it half-started.
            proc.signal(signal.SIGKILL)
            proc.state = "down"
            raise
        proc.state = "up"

    async def start_etcd(self) -> None:
        """Every etcd member, until each answers healthy (LocalEtcd, as `cluster up`)."""
        etcd = self.etcd
        if etcd is None:
            return
        try:
            # Started from this thread: `setpriv --pdeathsig` (LocalEtcd's prefix) signals
            # a member when the *thread* that started it ends, and worker threads do.
            etcd.start(wait=False)
            await asyncio.to_thread(etcd.wait_healthy)
        finally:
            for i, m in enumerate(etcd.members):
                if m.proc is not None:
                    self.pids.append(m.proc.pid)
                    self.etcd_state[i] = "up" if m.running else "down"

    async def start_controller(self, i: int = 1) -> None:
        await self._launch(self.controllers[i], self.controller_cmd(i))

    async def start_broker(self, broker_id: int, *, lose_unflushed: bool = False) -> None:
        cmd = self.broker_cmd(broker_id, lose_unflushed=lose_unflushed)
        await self._launch(self.broker[broker_id], cmd)

    async def kill(self, proc: Proc, sig: int = signal.SIGKILL) -> None:
        """Send `sig` (SIGKILL or SIGTERM) and wait until the process has exited."""
        if proc.state == "paused":
            proc.signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        proc.state = "stopping"  # exiting on purpose (not an unexpected exit)
        proc.signal(sig)
        if await proc.wait_exit(30.0) is None:
            proc.signal(signal.SIGKILL)
            await proc.wait_exit(10.0)
        proc.state = "down"
        proc.release()

    def pause(self, proc: Proc) -> None:
        proc.signal(signal.SIGSTOP)
        proc.state = "paused"

    def resume(self, proc: Proc) -> None:
        proc.signal(signal.SIGCONT)
        proc.state = "up"

    # --- etcd members ---------------------------------------------------------------------

    def etcd_leader(self) -> int | None:
        """The index of the etcd member that leads now, as the members that are up say
        (a paused member answers nothing); None while none is known (an election)."""
        etcd = self.etcd
        if etcd is None:
            return None
        leader = None
        for i, m in enumerate(etcd.members):
            if self.etcd_state.get(i) != "up":
                continue
            status = member_status(m.client_url, context=getattr(m, "ssl_context", None))
            if status is None:
                continue
            self.etcd_ids[i] = status[0]
            if status[1] != "0":
                leader = status[1]
        return next((i for i, mid in self.etcd_ids.items() if mid == leader), None)

    async def kill_etcd(self, i: int) -> None:
        """SIGKILL member `i` and wait until it has exited."""
        assert self.etcd is not None
        if self.etcd_state.get(i) == "paused":
            self.etcd.signal_member(i, signal.SIGCONT)
        await asyncio.to_thread(self.etcd.kill_member, i)
        self.etcd_state[i] = "down"

    async def restart_etcd(self, i: int, timeout_s: float = 30.0) -> None:
        """Start member `i` again on its data directory and ports, until it is healthy."""
        etcd = self.etcd
        assert etcd is not None
        etcd.start_member(i)
        m = etcd.members[i]
        if m.proc is not None:
            self.pids.append(m.proc.pid)
        deadline = time.monotonic() + timeout_s
        while not await asyncio.to_thread(m.healthy):
            if not m.running or time.monotonic() > deadline:
                raise RuntimeError(f"etcd member {m.name} did not come back (see {m.log_path})")
            await asyncio.sleep(0.1)  # polling an external process's health
        self.etcd_state[i] = "up"

    def pause_etcd(self, i: int) -> None:
        assert self.etcd is not None
        self.etcd.signal_member(i, signal.SIGSTOP)
        self.etcd_state[i] = "paused"

    def resume_etcd(self, i: int) -> None:
        assert self.etcd is not None
        self.etcd.signal_member(i, signal.SIGCONT)
        self.etcd_state[i] = "up"

    # --- all of them -----------------------------------------------------------------------

    def started_pids(self) -> dict[str, int]:
        out = {}
        for p in (*self.controllers.values(), *self.broker.values()):
            if p.pid is not None and p.alive():
                out[p.name] = p.pid
        if self.etcd is not None:
            for m in self.etcd.members:
                if m.proc is not None and m.running:
                    out[m.name] = m.proc.pid
        return out

    async def stop_all(self, grace_s: float = 10.0) -> None:
        """Stop every process: resume, SIGTERM (brokers, then the controllers, then
        etcd), SIGKILL after `grace_s`. Safe to call more than once and after a partial
        start."""
        for group in (list(self.broker.values()), list(self.controllers.values())):
            for p in group:
                if p.alive():
                    p.signal(signal.SIGCONT)
                    p.signal(signal.SIGTERM)
            for p in group:
                if p.alive() and await p.wait_exit(grace_s) is None:
                    p.signal(signal.SIGKILL)
                    await p.wait_exit(5.0)
                p.state = "down"
                p.release()
        if self.etcd is not None:
            await asyncio.to_thread(self.etcd.stop, grace_s)
            self.etcd_state = dict.fromkeys(self.etcd_state, "down")

    def kill_all(self) -> None:
        """SIGKILL every process group at once (a paused one too) and reap them, without
        awaiting anything: the last resort when `stop_all` cannot run to its end."""
        procs = [*self.broker.values(), *self.controllers.values()]
        for p in procs:
            p.signal(signal.SIGKILL)
        if self.etcd is not None:
            for i in range(len(self.etcd.members)):
                self.etcd.signal_member(i, signal.SIGKILL)
        for p in procs:
            if p.popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.popen.wait(10.0)
            p.state = "down"
            p.release()
        if self.etcd is not None:
            for m in self.etcd.members:
                if m.proc is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        m.proc.wait(10.0)
            self.etcd_state = dict.fromkeys(self.etcd_state, "down")
