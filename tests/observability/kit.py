"""Helpers for the observability tests: a controller on a real SQLite log with virtual
time whose replicas answer log inspections at once, and registry readers.

Test support only: nothing here is imported by the product.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import ssl
import string
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from controller.core.config import ControllerConfig
from controller.core.recovery.tracker import Inspection
from controller.runtime.clock import VirtualClock
from controller.runtime.driver import Controller, Event
from controller.runtime.metrics import ControllerMetrics
from metactl.errors import (
    InvalidRequestError,
    MetactlError,
    StaleBrokerEpochError,
)
from metadata_image.delta import MetadataDelta
from metadata_log.records import MetadataRecord
from metadata_log.sqlite_store import SqliteLogStore
from protocol.address import parse_address
from protocol.client import RpcClient
from protocol.codec import decode_frame, encode_frame
from protocol.messages.admin import CreateTopic, ElectLeader
from protocol.messages.base import error_response
from protocol.messages.broker_controller import (
    BrokerHeartbeatRequest,
    GetReplicaLogInfoRequest,
    GetReplicaLogInfoResponse,
    RegisterBroker,
    RegisterBrokerResponse,
    ReplicaLogInfoEntry,
)
from protocol.messages.internal import FenceBroker, ReplicaLogInfo, UnfenceBroker
from protocol.messages.unions import ControllerResponse, Message
from protocol.tls import CA_CERT, VIEWER, cert_path, key_path
from protocol.transport import read_frame
from tests.e2e.cluster import free_port

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "grafana"


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    """One sample's value, or None when the series does not exist."""
    return registry.get_sample_value(name, labels)


def scrape_context(certs: Path, principal: str) -> ssl.SSLContext:
    """A scraper's TLS context, as Prometheus's tls_config builds it: the cluster CA, the
    principal's certificate and key, host names checked (the certificates name 127.0.0.1
    and localhost)."""
    ctx = ssl.create_default_context(cafile=str(certs / CA_CERT))
    ctx.load_cert_chain(str(cert_path(certs, principal)), str(key_path(certs, principal)))
    return ctx


class Cluster:
    """A Controller with metrics attached; replica logs answer inspections on request."""

    def __init__(self, store: SqliteLogStore, ctl: Controller, metrics: ControllerMetrics) -> None:
        self.store, self.ctl, self.metrics = store, ctl, metrics
        self.clock = ctl.clock
        self.registry = metrics.registry
        self.logs: dict[tuple[int, str, int], tuple[int, int]] = {}  # -> (epoch, LEO)
        self.outbox: list[Inspection] = []
        self.committed: list[MetadataRecord] = []
        self._incarnations: dict[int, int] = {}
        ctl.inspection_sinks.append(self.outbox.append)
        ctl.commit_listeners.append(self._on_commit)

    @classmethod
    async def open(cls, data_dir: Path, config: ControllerConfig | None = None) -> Cluster:
        store = await SqliteLogStore.open(data_dir)
        ctl = await Controller.open(store, config=config, clock=VirtualClock(0))
        return cls(store, ctl, ControllerMetrics.attach(ctl, CollectorRegistry()))

    async def close(self) -> None:
        await self.ctl.close()
        await self.store.close()

    def _on_commit(
        self, base: int, records: Sequence[MetadataRecord], delta: MetadataDelta, now_ms: int
    ) -> None:
        self.committed.extend(records)

    def value(self, name: str, **labels: str) -> float | None:
        return value(self.registry, name, **labels)

    def epoch(self, broker: int) -> int:
        b = self.ctl.image.broker(broker)
        assert b is not None
        return b.epoch

    async def submit(self, request: Event) -> ControllerResponse:
        response = await self.ctl.submit(request)
        await self.answer_inspections()
        return response

    async def answer_inspections(self) -> None:
        while self.outbox:
            insp = self.outbox.pop(0)
            b = self.ctl.image.broker(insp.broker_id)
            if b is None or not b.active or b.epoch != insp.broker_epoch:
                continue
            epoch, leo = self.logs.get((insp.broker_id, insp.topic, insp.partition), (0, 0))
            try:
                await self.ctl.submit(
                    ReplicaLogInfo(
                        broker_id=insp.broker_id,
                        broker_epoch=insp.broker_epoch,
                        topic=insp.topic,
                        partition=insp.partition,
                        last_leader_epoch=epoch,
                        log_end_offset=leo,
                    )
                )
            except MetactlError:
                continue

    async def register(self, broker: int, *, clean: bool = True) -> int:
        n = self._incarnations.get(broker, 0) + 1
        self._incarnations[broker] = n
        b = self.ctl.image.broker(broker)
        previous = b.epoch if clean and b is not None else None
        r = await self.submit(
            RegisterBroker(
                broker_id=broker, incarnation_id=f"b{broker}-{n}", previous_epoch=previous
            )
        )
        assert isinstance(r, RegisterBrokerResponse)
        return r.broker_epoch

    async def unfence(self, broker: int) -> None:
        await self.submit(UnfenceBroker(broker_id=broker, broker_epoch=self.epoch(broker)))

    async def fence(self, broker: int) -> None:
        await self.submit(FenceBroker(broker_id=broker))

    async def start_brokers(self, *brokers: int) -> None:
        for b in brokers:
            await self.register(b)
            await self.unfence(b)

    async def create_topic(
        self, name: str, assignments: list[list[int]], min_isr: int, strategy: str | None = None
    ) -> None:
        await self.submit(
            CreateTopic(
                name=name, assignments=assignments, min_isr=min_isr, recovery_strategy=strategy
            )
        )

    async def elect_unclean(self, topic: str, partition: int, replica: int) -> None:
        await self.submit(
            ElectLeader(topic=topic, partition=partition, election_type="unclean", replica=replica)
        )


# --- Prometheus tooling ---------------------------------------------------------------------

PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
NO_PROMTOOL = "promtool is not installed (the Makefile installs Debian's prometheus package)"
NO_PROMETHEUS = "prometheus is not installed (the Makefile installs Debian's prometheus package)"


def render_prometheus_config(
    controller: str,
    *,
    rules: Path = GRAFANA / "alerts.yml",
    brokers: Sequence[str] = (),
    scrape_interval: str = "1s",
    evaluation_interval: str = "1s",
    certs: Path | None = None,
) -> str:
    """grafana/prometheus.yml.tmpl with its ${...} placeholders filled (as envsubst would).
    With `certs` (a `metactl certs init` directory) every job scrapes over mutual TLS as
    `viewer`, as grafana/README.md shows."""
    template = string.Template((GRAFANA / "prometheus.yml.tmpl").read_text(encoding="utf-8"))
    text = template.safe_substitute(
        SCRAPE_INTERVAL=scrape_interval,
        EVALUATION_INTERVAL=evaluation_interval,
        RULES=str(rules),
        CONTROLLER=controller,
        BROKERS=", ".join(json.dumps(b) for b in brokers),
    )
    config = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert "$" not in "\n".join(config), "a placeholder of the template was not filled"
    if certs is None:
        return text
    doc = yaml.safe_load(text)
    for job in doc["scrape_configs"]:
        job["scheme"] = "https"
        job["tls_config"] = {
            "ca_file": str(certs / CA_CERT),
            "cert_file": str(cert_path(certs, VIEWER)),
            "key_file": str(key_path(certs, VIEWER)),
        }
    return str(yaml.safe_dump(doc, sort_keys=False))


class PrometheusServer:
    """Debian's prometheus binary on 127.0.0.1, with its storage under a test directory.

    Blocking (urllib, subprocess): call from a thread when an event loop must keep serving.
    """

    def __init__(self, proc: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
        self.proc, self.url, self.log_path = proc, url, log_path

    @classmethod
    def start(
        cls, workdir: Path, config_text: str, *, ready_timeout_s: float = 60
    ) -> PrometheusServer:
        assert PROMETHEUS is not None, NO_PROMETHEUS
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / "prometheus.yml"
        config.write_text(config_text, encoding="utf-8")
        for attempt in range(3):  # the free port may be taken between probe and bind
            port = free_port()
            log_path = workdir / f"prometheus-{attempt}.log"
            with log_path.open("wb") as log_file:
                proc = subprocess.Popen(
                    [
                        PROMETHEUS,
                        f"--config.file={config}",
                        f"--storage.tsdb.path={workdir / 'data'}",
                        f"--web.listen-address=127.0.0.1:{port}",
                        "--log.level=warn",
                    ],
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                )
            server = cls(proc, f"http://127.0.0.1:{port}", log_path)
            if server._wait_ready(ready_timeout_s):
                return server
            server.stop()
        raise AssertionError(f"prometheus did not start:\n{server.log_tail()}")

    def _wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return True
            except OSError:
                pass
            time.sleep(0.2)  # polling interval
        return False

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; returns `data` (raises on an error status)."""
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as r:
            doc = json.loads(r.read())
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


# --- brokers that answer GetReplicaLogInfo over real TCP -------------------------------------


class LogInfoBroker:
    """A stand-in broker: registers and heartbeats over the wire, and answers the
    controller's GetReplicaLogInfo requests from `logs` on a TCP listener of its own."""

    def __init__(self, broker_id: int, controller: str) -> None:
        self.broker_id = broker_id
        self.controller = controller
        self.logs: dict[tuple[str, int], tuple[int, int]] = {}  # -> (last leader epoch, LEO)
        self.epoch = -1
        self.endpoint = ""
        self.requests = 0
        self._server: asyncio.Server | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._incarnation = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.endpoint = f"{host}:{port}"

    async def close(self) -> None:
        await self.stop_heartbeats()
        if self._server is not None:
            self._server.close()

    async def register(self, *, clean: bool) -> None:
        self._incarnation += 1
        conn = await RpcClient.open(*parse_address(self.controller))
        try:
            r = await conn.request(
                RegisterBroker(
                    broker_id=self.broker_id,
                    incarnation_id=f"broker-{self.broker_id}-{self._incarnation}",
                    previous_epoch=self.epoch if clean and self.epoch >= 0 else None,
                    endpoint=self.endpoint,
                )
            )
        finally:
            await conn.close()
        assert isinstance(r, RegisterBrokerResponse)
        self.epoch = r.broker_epoch

    def start_heartbeats(self, interval_s: float = 0.1) -> None:
        self._heartbeat = asyncio.create_task(self._beat(interval_s))

    async def stop_heartbeats(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
            self._heartbeat = None

    async def _beat(self, interval_s: float) -> None:
        conn = await RpcClient.open(*parse_address(self.controller))
        try:
            while True:
                with contextlib.suppress(MetactlError):
                    await conn.request(
                        BrokerHeartbeatRequest(
                            broker_id=self.broker_id,
                            broker_epoch=self.epoch,
                            metadata_offset=self.epoch + 1,  # caught up: may be unfenced
                        )
                    )
                await asyncio.sleep(interval_s)  # the heartbeat period
        finally:
            await conn.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                frame = decode_frame(await read_frame(reader))
                body = frame.body
                reply: Message
                if isinstance(body, GetReplicaLogInfoRequest) and body.broker_epoch == self.epoch:
                    self.requests += 1
                    entries = []
                    for ref in body.partitions:
                        epoch, leo = self.logs.get((ref.topic, ref.partition), (0, 0))
                        entries.append(
                            ReplicaLogInfoEntry(
                                topic=ref.topic,
                                partition=ref.partition,
                                last_leader_epoch=epoch,
                                log_end_offset=leo,
                            )
                        )
                    reply = GetReplicaLogInfoResponse(
                        broker_id=self.broker_id, broker_epoch=self.epoch, partitions=entries
                    )
                elif isinstance(body, GetReplicaLogInfoRequest):
                    reply = error_response(
                        StaleBrokerEpochError(
                            f"broker epoch is {self.epoch}, not {body.broker_epoch}"
                        )
                    )
                else:
                    reply = error_response(InvalidRequestError(f"unexpected {type(body).__name__}"))
                writer.write(encode_frame(frame.correlation_id, reply))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, MetactlError):
            pass
        finally:
            writer.close()


# --- real processes --------------------------------------------------------------------------


class Proc:
    """A child process that prints a READY line on stdout (the controller, a broker)."""

    def __init__(self, name: str, args: list[str], log_path: Path) -> None:
        self.name = name
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, *args],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            cwd=REPO,
            start_new_session=True,
        )
        self.ready: dict[str, str] = {}

    def await_ready(self) -> dict[str, str]:
        """Block until READY (the caller bounds this with a timeout); return its fields."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("READY"):
                self.ready = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
                return self.ready
        raise AssertionError(f"{self.name} exited with {self.proc.wait()} before READY")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=10)
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self._log.close()
