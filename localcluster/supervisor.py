"""The supervisor behind `metactl cluster up`: a local cluster, supervised, until stopped.

What it starts, each a child process in a process group of its own
(`localcluster.children`), its output in ``DATA_DIR/logs``:

* with ``--etcd M`` (M ≥ 1), an etcd cluster of M members from Debian's binary
  (`localcluster.etcd`), and ``--controllers N`` controllers sharing the metadata log on
  it (one active, the others hot standbys, docs/ha.md); without, one controller on the
  SQLite log in ``DATA_DIR/controller``;
* ``--brokers B`` brokers, given every controller's address, each serving /metrics on
  the ports after the controllers' (DATA_DIR/prometheus.yml scrapes them all,
  `localcluster.scrape_config`), and Kafka's wire protocol (``--kafka-listen``,
  docs/kafka.md) on ``--kafka-base-port`` and up (ports: `localcluster.settings`, on the host
  of ``--listen``; none with ``--no-kafka``), with the cluster's TLS; their command
  lines, Kafka addresses included, are recorded in DATA_DIR/cluster-up.json;
* every controller a Kafka listener too (KIP-919, for admin clients that bootstrap from
  the controllers), ``CONTROLLER_KAFKA_OFFSET`` ports above the brokers' base (19192 and
  up by default; none with ``--no-kafka``), its command line and address recorded beside
  the brokers' (``"controller_processes"``), a port 0 pinned to the one bound;
* before the first of them, on a first start, every controller's and broker's data
  directory is formatted (`localcluster.storage.format_cluster`, docs/operations.md):
  the cluster id is the one the directories record, else the metadata log's, else a new
  random one, and every child is given it (``--cluster-id``), so a directory of another
  cluster is refused;
* the demo topic, once every broker is active.

How it supervises (`run_cluster`):

* **Start-up** never hangs: each child must print its READY line within a bound; a
  child that exits first, or does not make it in time, fails the start with one line
  naming it, the last lines of its log, and everything started so far stopped. A second
  `cluster up` on the same data directory is refused at once (a lock file names the
  running one's pid) instead of failing later inside a child.
* **Running**, it says when a child dies, with its exit status and the last lines of its
  log (readable: `localcluster.child_log`); the rest keep running (killing a broker is
  how the demo is tried). Beside that it runs the feed its caller gives (`cluster up`'s
  command prints the committed log as readable events), and, for a quorum on etcd, says
  who is active once started and after every change of term ("controller 3 is active
  now (term 1234); controller 2 lost it (dead-active detection)", `localcluster.active`,
  from the log's ControllerChangeRecords), with or without the feed. `metactl broker
  start --id N` and `metactl controller start --node-id cN` ask it, through its control
  socket (`localcluster.control`), to start broker N or controller N again with its
  recorded command line (its ports pinned to those it first bound), as a supervised
  child like the first (`localcluster.restarts`); a controller comes back a standby.
  `metactl roll` asks it to restart brokers one at a time (a controlled shutdown, then
  the same start; `localcluster.roll` drives the roll).
* **Stopping** (Ctrl-C, SIGTERM, or a failure): brokers first (their controlled
  shutdown needs a controller), then the controllers, then etcd; each gets SIGTERM, and
  SIGKILL if it outlives the bound. It says what it stops, in order, and how long each
  took, as each one ends (`localcluster.children.stop_children`).
* **If `cluster up` itself dies** (SIGKILL), its children do not outlive it: each is
  started through util-linux's ``setpriv --pdeathsig SIGTERM``, so the kernel sends them
  SIGTERM when their parent goes (strictly, when the parent *thread* that started them
  ends: `cluster up` starts them from a worker thread, and stops them in order before
  that thread ends).

The children are the real processes (`python -m controller`, `python -m brokers_stub`,
`etcd`); this module decides nothing about metadata, and must not import the CLI
(`ops`): its banner and its event feed are the command's (ops/cluster_cmds.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from clients.controller import INSECURE, Security, call
from localcluster.active import ActiveWatch, numbered
from localcluster.certs import default_names, etcd_dir, init_certs, init_etcd_certs
from localcluster.child_log import failure_reason
from localcluster.children import Child, exit_text, stop_children
from localcluster.control import CONTROL_SOCKET, serve, write_record
from localcluster.etcd import LocalEtcd
from localcluster.ports import await_listenable, cluster_listeners
from localcluster.procs import await_active_brokers, ready_line
from localcluster.restarts import Restarts
from localcluster.scrape_config import write_prometheus_config
from localcluster.settings import (
    UpSettings,
    port_plus,
)
from localcluster.storage import format_cluster
from metactl.errors import (
    ClusterStartError,
    StoreUnavailableError,
    with_details,
)
from metactl.processes import dies_with_parent
from metadata_log.etcd.tls import tls_flags
from protocol.messages.admin import CreateTopic, CreateTopicsRequest, CreateTopicsResponse
from protocol.tls import ADMIN, CONTROLLER, TlsIdentity

__all__ = ["ClusterUp", "metactl_path", "run_cluster"]

READY_TIMEOUT_S: Final = 60.0
LOCK_FILE: Final = "cluster.lock"


def metactl_path() -> str:
    """This environment's `metactl` by its full path (the venv's bin directory need not
    be on PATH; `source .venv/bin/activate` puts it there)."""
    script = Path(sys.executable).with_name("metactl")
    return str(script) if script.exists() else "metactl"


@dataclass
class ClusterUp:
    settings: UpSettings
    children: list[Child] = field(default_factory=list)
    etcd: LocalEtcd | None = None
    controllers: list[str] = field(default_factory=list)
    metrics: list[str] = field(default_factory=list)
    security: Security = INSECURE
    certs: Path | None = None
    cluster_id: str = ""  # set by start(): the directories' (docs/operations.md)
    formatted: list[str] = field(default_factory=list)  # directories formatted by start()
    # Each broker's command line (`broker start` runs it again) and /metrics address.
    broker_cmds: dict[int, list[str]] = field(default_factory=dict)
    broker_metrics: dict[int, str] = field(default_factory=dict)
    broker_kafka: dict[int, str] = field(default_factory=dict)  # Kafka listeners, by id
    # Each controller's command line (its Kafka port pinned once bound) and Kafka
    # listener, by number (1 and up, in --listen's order).
    controller_cmds: dict[int, list[str]] = field(default_factory=dict)
    controller_kafka: dict[int, str] = field(default_factory=dict)
    _lock: int | None = None

    @property
    def data(self) -> Path:
        return self.settings.data_dir

    @property
    def bootstrap(self) -> str:
        return ",".join(self.controllers)

    # --- start ---------------------------------------------------------------------------

    def lock(self) -> None:
        """One `cluster up` per data directory."""
        self.data.mkdir(parents=True, exist_ok=True)
        path = self.data / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ClusterStartError(
                f"a cluster is already running on {self.data} (pid {holder}); stop it with "
                "Ctrl-C, or pass another --data-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock = fd

    def spawn(self, name: str, kind: str, cmd: list[str]) -> Child:
        log_path = self.log_path(name)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = log_path.open("a")
        log_file.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} cluster up starts {name}\n")
        log_file.flush()
        proc = subprocess.Popen(
            [*dies_with_parent(), *cmd],
            stdout=subprocess.PIPE,
            stderr=log_file,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        child = Child(name, kind, proc, log_path, log_file)
        self.children.append(child)
        return child

    def await_ready(self, child: Child, timeout_s: float = READY_TIMEOUT_S) -> str:
        """Its READY line, or ClusterStartError naming it (exited, or silent too long)."""
        try:
            line = ready_line(child.proc, timeout_s)
        except TimeoutError as exc:
            raise self._failed(child, str(exc)) from None
        if line is None:
            child.reported = True
            status = exit_text(child.proc.wait())
            raise self._failed(child, f"exited before it was ready ({status})")
        child.ready = line
        return line

    def _failed(self, child: Child, what: str) -> ClusterStartError:
        """One line (who, what, and why, from the end of its log), then the end of its
        log, readable, as the error's details (issue 22: never its raw JSON lines)."""
        reason = failure_reason(child.tail(64))
        error = ClusterStartError(
            f"{child.name} {what}" + (f": {reason}" if reason else "") + f" (log: {child.log_path})"
        )
        return with_details(
            error, [f"  the last lines of {child.log_path}:", *child.readable_tail()]
        )

    def start(self) -> None:
        s = self.settings
        s.check()
        self.lock()
        # Each fixed port free, or a named error with the flag that moves it (a port
        # held by closing connections only is waited for, and said so).
        await_listenable(
            cluster_listeners(s.listeners()), notify=lambda line: print(line, flush=True)
        )
        py = sys.executable
        if s.insecure:
            flags: list[str] = ["--insecure"]
        else:
            self.certs = self.data / "certs"
            created = init_certs(self.certs, default_names(range(1, s.brokers + 1)))
            if created:
                print(f"certificates: created {', '.join(created)} in {self.certs}", flush=True)
            flags = ["--tls-dir", str(self.certs)]
            self.security = Security(TlsIdentity.from_dir(self.certs, ADMIN))
        log_flags: list[str] = []
        if s.etcd:
            self.etcd = LocalEtcd(
                self.data / "etcd", s.etcd, tls_dir=self._etcd_tls_dir(),
                base_port=s.etcd_pinned_base_port, default_base_port=s.etcd_first_base_port,
                notify=lambda line: print(line, flush=True),
            )  # fmt: skip
            if self.etcd.kept_plaintext or (s.insecure and self.etcd.tls_dir is not None):
                print(
                    f"etcd: {'plaintext' if self.etcd.tls_dir is None else 'TLS'}, as its "
                    "members were first started (their peer URLs are part of their "
                    "identity); a new --data-dir chooses again",
                    flush=True,
                )
            self.etcd.start(wait=False)
            for m in self.etcd.members:
                assert m.proc is not None
                self.children.append(Child(m.name, "etcd", m.proc, m.log_path, None))
            try:
                self.etcd.wait_healthy()
            except StoreUnavailableError as exc:
                bad = next((c for c in self.children if c.proc.poll() is not None), None)
                error = self._failed(bad, "exited") if bad else ClusterStartError(exc.message)
                raise error from None
            log_flags = [
                "--metadata-log",
                self.etcd.url("metactl"),
                *tls_flags(self.etcd.client_tls(CONTROLLER)),
            ]
        self.cluster_id = self.format_storage()
        log_flags += [f"--cluster-id={self.cluster_id}"]  # an id may begin with "-"
        for i in range(s.controllers):
            listen, metrics = port_plus(s.listen, i), port_plus(s.metrics, i)
            name = "controller" if s.controllers == 1 else f"controller {i + 1}"
            data = self.controller_dir(i)
            kafka = s.controller_kafka_listen(i)
            self.controller_cmds[i + 1] = [
                py, "-m", "controller", "--data-dir", str(data), "--listen", listen,
                "--metrics", metrics, *(["--kafka-listen", kafka] if kafka else []),
                "--unclean-recovery-strategy", s.strategy,
                *log_flags, *(["--node-id", f"c{i + 1}"] if s.etcd else []), *flags,
            ]  # fmt: skip
            self.spawn(name, "controller", self.controller_cmds[i + 1])
        for n, c in enumerate([c for c in self.children if c.kind == "controller"], 1):
            self.note_controller_ready(n, self.await_ready(c))
        for b in range(1, s.brokers + 1):
            # /metrics after the controllers' ports (port 0: any free port, each its own).
            metrics = port_plus(s.metrics, s.controllers + b - 1)
            kafka = s.kafka_listen(b)
            self.broker_cmds[b] = [
                py, "-m", "brokers_stub", "--id", str(b), "--controller", self.bootstrap,
                "--data-dir", str(self.broker_dir(b)), f"--cluster-id={self.cluster_id}",
                "--metrics", metrics, *(["--kafka-listen", kafka] if kafka else []), *flags,
            ]  # fmt: skip
            self.spawn(f"broker {b}", "broker", self.broker_cmds[b])
        for c in [c for c in self.children if c.kind == "broker"]:
            self.note_broker_ready(c, self.await_ready(c))
        self.write_record()

    def note_controller_ready(self, n: int, ready: str) -> None:
        """Controller `n`'s addresses, from its READY line; a port 0 (any free port) is
        pinned in its recorded command line, as a broker's is, so that `controller start`
        brings it back where the brokers, the other controllers and Prometheus look."""
        fields = dict(p.split("=", 1) for p in ready.split()[2:] if "=" in p)
        while len(self.controllers) < n:
            self.controllers.append("")
            self.metrics.append("")
        self.controllers[n - 1] = fields["listen"]
        self.metrics[n - 1] = fields.get("metrics", "")
        if "kafka" in fields:
            self.controller_kafka[n] = fields["kafka"]
        cmd = self.controller_cmds.get(n, [])
        for key, flag in (
            ("listen", "--listen"),
            ("metrics", "--metrics"),
            ("kafka", "--kafka-listen"),
        ):
            if key in fields and flag in cmd:
                cmd[cmd.index(flag) + 1] = fields[key]

    def note_broker_ready(self, child: Child, ready: str) -> None:
        """Its /metrics and Kafka addresses, from its READY line; a port 0 (any free
        port) is pinned in its recorded command line, so that `broker start` brings it
        back where DATA_DIR/prometheus.yml scrapes it and Kafka clients find it."""
        fields = dict(p.split("=", 1) for p in ready.split()[1:] if "=" in p)
        if "broker" not in fields:
            return
        broker = int(fields["broker"])
        cmd = self.broker_cmds.get(broker, [])
        for key, flag, known in (
            ("metrics", "--metrics", self.broker_metrics),
            ("kafka", "--kafka-listen", self.broker_kafka),
        ):
            if key in fields:
                known[broker] = fields[key]
                if flag in cmd:
                    cmd[cmd.index(flag) + 1] = fields[key]

    def write_record(self) -> Path:
        """``DATA_DIR/cluster-up.json``: how this cluster runs, each broker's command line
        included (`localcluster.control`; `metactl broker start` has it run again), and
        each controller's (``"controller_processes"``, by number: its addresses, Kafka's
        included)."""
        controllers = {
            str(n): {
                "argv": cmd,
                "pid": next((c.proc.pid for c in self.named(self.controller_name(n))), None),
                "node_id": f"c{n}",
                "listen": listen,
                "metrics": metrics or None,
                "kafka": self.controller_kafka.get(n),
                "log": str(self.log_path(self.controller_name(n))),
            }
            for (n, cmd), listen, metrics in zip(
                sorted(self.controller_cmds.items()),
                self.controllers,
                self.metrics,
                strict=False,  # all of them once start() has them all ready
            )
        }
        brokers = {
            str(b): {
                "argv": cmd,
                "pid": next((c.proc.pid for c in self.named(f"broker {b}")), None),
                "metrics": self.broker_metrics.get(b),
                "kafka": self.broker_kafka.get(b),
                "log": str(self.log_path(f"broker {b}")),
            }
            for b, cmd in self.broker_cmds.items()
        }
        return write_record(
            self.data,
            {
                "pid": os.getpid(),
                "control_socket": str(self.data / CONTROL_SOCKET),
                "controllers": self.controllers,
                "metrics": self.metrics,
                "cluster_id": self.cluster_id,
                "tls_dir": str(self.certs) if self.certs is not None else None,  # None: plain
                "controller_processes": controllers,
                "brokers": brokers,
            },
        )

    def named(self, name: str) -> list[Child]:
        return [c for c in self.children if c.name == name]

    def controller_name(self, n: int) -> str:
        return "controller" if self.settings.controllers == 1 else f"controller {n}"

    def start_command(self, child: Child) -> str:
        """The command that brings a broker or controller of this cluster back (`metactl
        broker start`, `metactl controller start`), as the banner names metactl."""
        number = child.name.split()[-1] if " " in child.name else "1"
        if child.kind == "controller":
            return f"{metactl_path()} controller start --node-id c{number} --data-dir {self.data}"
        return f"{metactl_path()} broker start --id {number} --data-dir {self.data}"

    def prometheus_config(self) -> Path:
        """``DATA_DIR/prometheus.yml``: scrapes the controllers and every broker."""
        brokers = [self.broker_metrics[b] for b in sorted(self.broker_metrics)]
        return write_prometheus_config(self.data, self.metrics, brokers, self.certs)

    def log_path(self, name: str) -> Path:
        return self.data / "logs" / f"{name.replace(' ', '-')}.log"

    def controller_dir(self, i: int) -> Path:
        single = self.settings.controllers == 1
        return self.data / ("controller" if single else f"controller-{i + 1}")

    def broker_dir(self, broker_id: int) -> Path:
        return self.data / f"broker-{broker_id}"

    def format_storage(self) -> str:
        """The cluster's id, with every controller's and broker's directory formatted on
        a first start (`localcluster.storage.format_cluster`)."""
        s = self.settings
        controllers = [self.controller_dir(i) for i in range(s.controllers)]
        brokers = {b: self.broker_dir(b) for b in range(1, s.brokers + 1)}
        cluster_id, self.formatted = format_cluster(self.data, controllers, brokers, self.etcd)
        return cluster_id

    @property
    def etcd_flags_text(self) -> str:
        """The admin's etcd TLS flags, for a printed offline command ("" if none)."""
        tls = self.etcd.client_tls(ADMIN) if self.etcd is not None else None
        return " " + " ".join(tls.flags()) if tls is not None else ""

    def _etcd_tls_dir(self) -> Path | None:
        """The etcd certificates (made in DATA_DIR/certs/etcd if absent, `localcluster.certs`), or
        None: plaintext, with --insecure, unless the etcd cluster was first started with
        TLS (its members remember https peer URLs)."""
        certs = self.data / "certs"
        if self.settings.insecure and not LocalEtcd.kept_tls(self.data / "etcd"):
            return None
        created = init_etcd_certs(certs)
        if created:
            print(f"certificates: created {', '.join(created)} in {certs}", flush=True)
        return etcd_dir(certs)

    async def create_demo_topic(self) -> str:
        s = self.settings
        await self._await_active_brokers()
        spec = CreateTopic(
            name=s.topic,
            partitions=s.partitions,
            replication_factor=min(3, s.brokers),
            min_isr=min(s.min_isr, s.brokers),
        )
        r = await call(self.bootstrap, CreateTopicsRequest(topics=[spec]), security=self.security)
        assert isinstance(r, CreateTopicsResponse)
        res = r.results[0]
        return "created" if not res.error_code else f"kept ({res.error_code})"

    async def _await_active_brokers(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        try:
            await await_active_brokers(
                self.bootstrap,
                self.settings.brokers,
                timeout_s,
                security=self.security,
                check=self.check_alive_during_start,
            )
        except RuntimeError as exc:
            raise ClusterStartError(str(exc)) from None

    def check_alive_during_start(self) -> None:
        for c in self.children:
            status = c.proc.poll()
            if status is not None:
                c.reported = True
                raise self._failed(c, f"exited ({exit_text(status)})")

    # --- running -------------------------------------------------------------------------

    def deaths(self) -> list[str]:
        """One report per child that died since the last call. It runs on the event loop:
        of each dead child's log it reads only the end (`tail_lines`: at most
        `TAIL_MAX_BYTES`), however long the child ran."""
        out = []
        for c in self.children:
            status = c.proc.poll()
            if status is not None and not c.reported:
                c.reported = True
                tail = "\n".join(c.readable_tail())
                report = (
                    f"!! {c.name} (pid {c.proc.pid}) exited: {exit_text(status)}; the last "
                    f"lines of {c.log_path}:\n{tail}"
                )
                if c.kind in ("broker", "controller"):
                    report += f"\n   bring it back: {self.start_command(c)}"
                out.append(report)
        return out

    async def supervise(
        self, stop: asyncio.Event, feed: Callable[[], Coroutine[Any, Any, None]] | None = None
    ) -> None:
        """Print deaths, run `feed` (the cluster's events in the foreground, if given),
        say who is active at each new term of a quorum (`localcluster.active`), and answer
        `broker start`, `controller start` and `roll` (`localcluster.restarts`), until
        `stop` is set."""
        tasks = [asyncio.create_task(self._watch(stop))]
        if feed is not None:
            tasks.append(asyncio.create_task(feed()))
        if self.etcd is not None:  # a quorum: say who is active, at each new term
            name = numbered(lambda: self.controller_cmds)
            watch = ActiveWatch(lambda: self.bootstrap, self.security, name, _say)
            tasks.append(asyncio.create_task(watch.run()))
        restarts = Restarts(self)
        try:
            control: asyncio.AbstractServer | None = await serve(self.data, restarts.answer)
        except OSError as exc:  # e.g. a data directory path too long for a Unix socket
            control = None
            print(f"(metactl broker/controller start and roll are not available: {exc})",
                  flush=True)  # fmt: skip
        try:
            await stop.wait()
        finally:
            if control is not None:
                control.close()
                with contextlib.suppress(OSError):
                    (self.data / CONTROL_SOCKET).unlink()
            await restarts.close()  # no child started once the stop begins
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for report in self.deaths():
                print(report, flush=True)
            await asyncio.sleep(0.5)  # the supervision period

    # --- stop ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Every child stopped in order (`localcluster.children.stop_children`), and the
        data directory's lock released. Idempotent."""
        stop_children(self.children, say=lambda line: print(line, flush=True))
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def _say(line: str) -> None:
    print(f"   {line}", flush=True)


def run_cluster(
    up: ClusterUp,
    *,
    announce: Callable[[str], None],
    feed: Callable[[], Coroutine[Any, Any, None]] | None = None,
    exit_after_ready: bool = False,
) -> bool:
    """Start `up`, create the demo topic, `announce` it (given what became of the topic),
    then supervise it (`ClusterUp.supervise`, with `feed`) until SIGINT or SIGTERM, and
    stop everything in order. True once it ran (or, with `exit_after_ready`, was ready);
    False if interrupted during start-up (everything started is stopped)."""
    stop = asyncio.Event()

    async def run() -> bool:
        # The children are started from an executor thread, and `setpriv --pdeathsig`
        # signals a child when the *thread* that forked it exits, which asyncio.run's
        # executor shutdown does once this returns: every child would get SIGTERM at once.
        # So they are stopped here, in order, while that thread is still alive.
        try:
            return await supervised()
        finally:
            await asyncio.to_thread(up.stop)

    async def supervised() -> bool:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        starting = asyncio.ensure_future(asyncio.to_thread(up.start))
        waiter = asyncio.ensure_future(stop.wait())
        await asyncio.wait({starting, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():  # Ctrl-C during start-up: stop what started, then report
            waiter.cancel()
            await asyncio.to_thread(up.stop)
            with contextlib.suppress(BaseException):
                await starting
            print("interrupted during start-up; stopped everything", file=sys.stderr)
            return False
        waiter.cancel()
        starting.result()
        announce(await up.create_demo_topic())
        if exit_after_ready:
            return True
        await up.supervise(stop, feed)
        return True

    try:
        return asyncio.run(run())
    finally:
        up.stop()  # done already, unless asyncio.run itself failed
