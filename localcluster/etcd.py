"""A local etcd cluster on loopback, from Debian's etcd binary (`etcd-server`): what
`metactl cluster up --etcd N`, the HA tests and the HA benchmark run the metadata log on.

`LocalEtcd` starts N members (each its own process group, data dir and log file), waits
until every member answers its ``/health`` endpoint, and can kill, pause, resume and
restart single members (the tests' faults). Members listen on 127.0.0.1 only.

Ports are part of a member's identity: its data directory remembers the peer URLs it was
first started with, and a member restarted on other ports cannot rejoin. So the ports are
chosen once, on the first start (from `base_port` on, else from `default_base_port` on,
else free ones the kernel picks), kept in ``ports.json`` beside the members' data, and
reused by every later start on the same directory; asking for other ports (`base_port`)
or another member count there is INVALID_CONFIG. `cluster up` gives ``--etcd-base-port``,
12379 and up by default (`localcluster.settings`): below the kernel's ephemeral range,
where no outgoing connection is ever given a port. Free ones are in that range, and any
outgoing connection of the host may hold one when the members start again.

Before a member starts, its ports are looked at (`localcluster.ports.await_listenable`):
a listener or a live connection on one (a connection opened without SO_REUSEADDR keeps
etcd's listener off its port: measured) is LISTEN_FAILED naming it, the flag and, for
kept ports, ``ports.json`` and a new data directory; a closing connection (TIME-WAIT,
FIN-WAIT-2) is waited for, `notify` told. The members get `death_signal` when the thread
that started them ends (`metactl.processes.dies_with_parent`: SIGKILL for members that
may be paused). Nothing here knows the metadata log; it only runs etcd.

TLS: given the etcd certificate directory (`tls_dir`, ``<certs>/etcd`` as `metactl certs
init` writes it, `localcluster.certs`), members serve their client URLs over TLS with
``--client-cert-auth`` (only certificates of that CA get in) and talk to each other over
TLS with ``--peer-client-cert-auth``; `client_tls` is what a client presents. The scheme
is part of the peer URLs a member remembers, so, like the ports, it is chosen on the
first start and kept in ``ports.json``: a cluster first started in plaintext stays so
(`kept_plaintext` says it), and one started with TLS needs its certificates again.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from localcluster.ports import WantedPort, await_listenable, ephemeral_range
from metactl.errors import InvalidConfigurationError, StoreUnavailableError
from metactl.processes import dies_with_parent
from metadata_log.etcd.tls import EtcdTls
from protocol.tls import ADMIN, CA_CERT, cert_path, key_path

__all__ = [
    "ETCD_BINARY",
    "EtcdMember",
    "LocalEtcd",
    "etcd_binary",
    "free_ports",
]

ETCD_BINARY: Final = "etcd"
HEALTH_TIMEOUT_S: Final = 30.0
CLUSTER_TOKEN: Final = "metactl"
PORTS_FILE: Final = "ports.json"
# Raft timing (docs/ha.md, "Losing the etcd leader"): a lost or frozen leader is replaced
# within one to two election timeouts, well inside the controller's leadership (TTL 2 s less
# its safety margin); etcd's defaults (100 ms, 1000 ms) take up to 2 s. Pre-vote keeps a
# member resumed after a pause from deposing a healthy leader with a needless election.
HEARTBEAT_MS: Final = 50
ELECTION_TIMEOUT_MS: Final = 500
# The certificate names in the etcd certificate directory (`localcluster.certs.init_etcd_certs`).
SERVER_CERT: Final = "server"
PEER_CERT: Final = "peer"


def etcd_binary() -> str:
    """The etcd server binary, or INVALID_CONFIG naming the package to install."""
    found = shutil.which(ETCD_BINARY) or (
        "/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None
    )
    if found is None:
        raise InvalidConfigurationError(
            "etcd is not installed: `make system` installs Debian's etcd-server (so does "
            "`make test`), or put an etcd 3.4+ binary on PATH"
        )
    return found


def free_ports(n: int) -> list[int]:
    """`n` distinct TCP ports free on 127.0.0.1 now (all held at once while choosing)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class EtcdMember:
    name: str
    data_dir: Path
    client_port: int
    peer_port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    # TLS: the context /health is asked with (the CA, a client certificate); None: http.
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False)

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context is not None else "http"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.peer_port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"{self.client_url}/health", timeout=1, context=self.ssl_context
            ) as r:
                return bool(json.loads(r.read()).get("health") == "true")
        except (OSError, ValueError, urllib.error.URLError):
            return False


class LocalEtcd:
    """`members` etcd processes forming one cluster under `base_dir`."""

    def __init__(
        self,
        base_dir: Path,
        members: int = 1,
        *,
        base_port: int | None = None,
        default_base_port: int | None = None,
        tls_dir: Path | None = None,
        death_signal: str = "SIGTERM",
        notify: Callable[[str], None] | None = None,
        port_wait_s: float | None = None,
    ) -> None:
        """`base_port`: the ports, which a directory that kept others refuses;
        `default_base_port`: a first start's without `base_port` (None: free ones);
        `death_signal`: what a member gets when the thread that started it ends;
        `notify`: told of what a start waits for, and of kept ports in the kernel's
        ephemeral range; `port_wait_s`: how long a closing connection on a member's port
        is waited for (default `localcluster.ports.closing_wait_s`)."""
        if not 1 <= members <= 9:
            raise InvalidConfigurationError(f"an etcd cluster of {members} members: use 1 to 9")
        self.base_dir = base_dir
        self.death_signal = death_signal
        self.notify = notify
        self.port_wait_s = port_wait_s
        self.kept_ports = (base_dir / PORTS_FILE).exists()  # chosen by an earlier start
        ports = self._ports(members, base_port, default_base_port)
        # The scheme the members were first started with, kept like their ports.
        self.tls_dir = self._scheme(tls_dir)
        self.kept_plaintext = tls_dir is not None and self.tls_dir is None
        context = self._health_context() if self.tls_dir is not None else None
        self.members = [
            EtcdMember(
                name=f"etcd-{i + 1}",
                data_dir=base_dir / f"etcd-{i + 1}",
                client_port=ports[2 * i],
                peer_port=ports[2 * i + 1],
                log_path=base_dir / f"etcd-{i + 1}.log",
                ssl_context=context,
            )
            for i in range(members)
        ]

    @staticmethod
    def kept_tls(base_dir: Path) -> bool | None:
        """Whether the etcd cluster in `base_dir` was first started with TLS (None: it
        never started)."""
        path = base_dir / PORTS_FILE
        if not path.exists():
            return None
        try:
            return bool(json.loads(path.read_text()).get("tls", False))
        except (OSError, ValueError, AttributeError):
            return False

    def _scheme(self, tls_dir: Path | None) -> Path | None:
        """The certificate directory to run with (None: plaintext): a cluster that has
        started before keeps its scheme, part of the peer URLs its members remember."""
        had_tls = self.kept_tls(self.base_dir)
        if had_tls is None:
            return tls_dir
        if had_tls and tls_dir is None:
            raise InvalidConfigurationError(
                f"the etcd cluster in {self.base_dir} was first started with TLS and its "
                "members remember https peer URLs: it needs its certificates (the "
                "directory `metactl certs init` writes in <certs>/etcd)"
            )
        return tls_dir if had_tls else None

    def _health_context(self) -> ssl.SSLContext:
        tls = self.client_tls(ADMIN)
        assert tls is not None and tls.cert is not None and tls.key is not None
        try:
            ctx = ssl.create_default_context(cafile=str(tls.cacert))
            ctx.load_cert_chain(str(tls.cert), str(tls.key))
        except (OSError, ssl.SSLError) as exc:
            raise InvalidConfigurationError(
                f"cannot load the etcd certificates in {self.tls_dir}: {exc} (`metactl "
                "certs init` writes them)"
            ) from None
        return ctx

    def client_tls(self, name: str = "controller") -> EtcdTls | None:
        """What a client (`controller` or `admin`) presents to these members; None when
        they run in plaintext."""
        if self.tls_dir is None:
            return None
        d = self.tls_dir
        return EtcdTls(d / CA_CERT, cert_path(d, name), key_path(d, name))

    def _ports(
        self, members: int, base_port: int | None, default_base_port: int | None
    ) -> list[int]:
        """Client and peer port of each member: those persisted on the first start, else
        `base_port` on (client, peer, client, ...), else `default_base_port` on, else
        free ones."""
        path = self.base_dir / PORTS_FILE
        wanted: list[int] | None = None
        for base in (base_port, default_base_port):
            if base is not None and not 1024 <= base <= 65536 - 2 * members:
                raise InvalidConfigurationError(
                    f"etcd base port {base} (--etcd-base-port): the {2 * members} ports "
                    "from it must be within 1024..65535"
                )
        if base_port is not None:
            wanted = list(range(base_port, base_port + 2 * members))
        if path.exists():
            try:
                saved = json.loads(path.read_text())
                ports = [int(p) for p in saved["ports"]]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise InvalidConfigurationError(
                    f"{path} is unreadable ({exc}); it holds the etcd members' ports"
                ) from None
            if len(ports) != 2 * members:
                raise InvalidConfigurationError(
                    f"the etcd cluster in {self.base_dir} has {len(ports) // 2} member(s), "
                    f"not {members}: its members keep their identity; use {len(ports) // 2}"
                )
            if wanted is not None and wanted != ports:
                raise InvalidConfigurationError(
                    f"the etcd cluster in {self.base_dir} was first started on ports "
                    f"{ports[0]}..{ports[-1]} and its members remember them: use "
                    f"--etcd-base-port {ports[0]} or a new data directory"
                )
            return ports
        if wanted is None and default_base_port is not None:
            wanted = list(range(default_base_port, default_base_port + 2 * members))
        return wanted if wanted is not None else free_ports(2 * members)

    def _save_ports(self) -> None:
        path = self.base_dir / PORTS_FILE
        if path.exists():
            return
        ports = [p for m in self.members for p in (m.client_port, m.peer_port)]
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump({"ports": ports, "tls": self.tls_dir is not None}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self.kept_ports = True

    def _wanted(self, m: EtcdMember) -> list[WantedPort]:
        """Member `m`'s ports, each with what to do if another process holds it."""
        if self.kept_ports:
            remedy = (
                f"the members' ports are kept in {self.base_dir / PORTS_FILE} since their "
                "first start (their data remembers them): free the port, or start on a new "
                "--data-dir, which chooses them again (from --etcd-base-port)"
            )
        else:
            remedy = "move the etcd members' ports with --etcd-base-port"
        return [
            WantedPort("127.0.0.1", port, f"etcd member {m.name}'s {kind} port", remedy)
            for kind, port in (("client", m.client_port), ("peer", m.peer_port))
        ]

    def _await_ports(self) -> None:
        """Every port of a member not running is free for etcd's listener (a closing
        connection on one waited for), or LISTEN_FAILED naming it: a named error now,
        rather than a member that exits and a health wait that times out."""
        low, high = ephemeral_range()
        ports = [p for m in self.members for p in (m.client_port, m.peer_port)]
        if self.notify is not None and any(low <= p <= high for p in ports):
            kept = f", kept in {self.base_dir / PORTS_FILE}," if self.kept_ports else ""
            self.notify(
                f"etcd: the members' ports {', '.join(map(str, ports))}{kept} are in the "
                f"kernel's ephemeral range ({low}-{high}), where any outgoing connection "
                "may hold one when they start again; a new --data-dir takes them from "
                "--etcd-base-port (default 12379 and up, below that range)"
            )
        wanted = [w for m in self.members if not m.running for w in self._wanted(m)]
        await_listenable(wanted, wait_s=self.port_wait_s, notify=self.notify)

    @property
    def endpoints(self) -> str:
        return ",".join(m.endpoint for m in self.members)

    def url(self, prefix: str) -> str:
        return f"etcd://{self.endpoints}/{prefix.strip('/')}"

    def _command(self, m: EtcdMember) -> list[str]:
        """Member `m`'s command line (prefixed, where util-linux's setpriv is there, so
        that it gets `death_signal` when the thread that started it ends)."""
        initial = ",".join(f"{x.name}={x.peer_url}" for x in self.members)
        state = "existing" if (m.data_dir / "member").exists() else "new"
        return [
            *dies_with_parent(self.death_signal),
            etcd_binary(),
            "--name", m.name,
            "--data-dir", str(m.data_dir),
            "--listen-client-urls", m.client_url,
            "--advertise-client-urls", m.client_url,
            "--listen-peer-urls", m.peer_url,
            "--initial-advertise-peer-urls", m.peer_url,
            "--initial-cluster", initial,
            "--initial-cluster-state", state,
            "--initial-cluster-token", CLUSTER_TOKEN,
            "--heartbeat-interval", str(HEARTBEAT_MS),
            "--election-timeout", str(ELECTION_TIMEOUT_MS),
            "--pre-vote",
            "--logger", "zap",
            *self._tls_flags(),
        ]  # fmt: skip

    def _tls_flags(self) -> list[str]:
        """Client and peer TLS, each requiring a certificate of the etcd CA."""
        d = self.tls_dir
        if d is None:
            return []
        ca = str(d / CA_CERT)
        return [
            "--cert-file", str(cert_path(d, SERVER_CERT)),
            "--key-file", str(key_path(d, SERVER_CERT)),
            "--trusted-ca-file", ca,
            "--client-cert-auth",
            "--peer-cert-file", str(cert_path(d, PEER_CERT)),
            "--peer-key-file", str(key_path(d, PEER_CERT)),
            "--peer-trusted-ca-file", ca,
            "--peer-client-cert-auth",
        ]  # fmt: skip

    def start(self, *, wait: bool = True) -> LocalEtcd:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self._await_ports()
        self._save_ports()
        for i in range(len(self.members)):
            self.start_member(i)
        if wait:
            self.wait_healthy()
        return self

    def start_member(self, i: int) -> None:
        m = self.members[i]
        if m.running:
            return
        m.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(m.log_path, "ab") as out:
            m.proc = subprocess.Popen(
                self._command(m),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: a Ctrl-C is ours to pass on
            )

    def wait_healthy(self, timeout_s: float = HEALTH_TIMEOUT_S) -> None:
        """Until every running member answers healthy; a member that exits meanwhile, or
        the timeout, is StoreUnavailableError naming its log."""
        deadline = time.monotonic() + timeout_s
        pending = [m for m in self.members if m.running]
        while pending:
            for m in list(pending):
                if m.proc is not None and m.proc.poll() is not None:
                    raise StoreUnavailableError(
                        f"etcd member {m.name} exited with status {m.proc.returncode} "
                        f"(see {m.log_path})"
                    )
                if m.healthy():
                    pending.remove(m)
            if pending:
                if time.monotonic() > deadline:
                    names = ", ".join(m.name for m in pending)
                    raise StoreUnavailableError(
                        f"etcd member(s) {names} not healthy after {timeout_s:g} s "
                        f"(see {self.base_dir})"
                    )
                time.sleep(0.05)  # polling interval of an external process's health

    def signal_member(self, i: int, sig: signal.Signals) -> None:
        m = self.members[i]
        if m.proc is not None and m.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(m.proc.pid, sig)

    def kill_member(self, i: int) -> None:
        self.signal_member(i, signal.SIGKILL)
        m = self.members[i]
        if m.proc is not None:
            m.proc.wait()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop every member, one after the other (SIGTERM, then SIGKILL after
        `timeout_s`). One at a time, as an operator would: a leader stopped while its
        followers stop too waits out etcd's 5 s leadership-transfer timeout (about 7 s for
        `cluster up`'s Ctrl-C, measured), while a leader stopped beside live followers
        hands over at once, and one with none left to take over does not try."""
        for i in range(len(self.members)):  # a paused member could hold up a handover
            self.signal_member(i, signal.SIGCONT)
        for i, m in enumerate(self.members):
            if m.proc is None:
                continue
            self.signal_member(i, signal.SIGTERM)
            try:
                m.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(m.proc.pid, signal.SIGKILL)
                m.proc.wait()

    def __enter__(self) -> LocalEtcd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
