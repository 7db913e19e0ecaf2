"""`metactl chaos run`: real processes, real faults, and a check of every acknowledged
record (docs/chaos.md).

One run: start a controller (or, with `--etcd M --controllers N`, an M-member etcd
cluster and N controllers on one metadata log in it) and B brokers (`chaos.processes`),
create a topic, produce with acks=all from in-process producers (the client code of
`metactl produce`: `Leaders`, `Connections`, `leader_request`, `AckedLog`; a batch counts
only once its line is fsynced in the acked log), inject a seeded fault plan
(`chaos.plan`, carried out by `chaos.faults`), heal, read every partition through ReadLog
from its leader and fetch the metadata log (`chaos.read`), scrape the controllers'
metrics (`chaos.watch`), and classify every acknowledged record (`chaos.check`).

With `--client librdkafka` (`chaos.kafka`) the brokers also listen for Kafka clients,
confluent-kafka producers (threads) produce instead, a librdkafka consumer follows every
partition through the run counting the log truncations it detects, and the read-back is
through Kafka Fetch too; a record is then present iff its value is at its offset
(`chaos.check.content_inputs`). A delivery report counts once its line is fsynced, and
it is appended to `acks` under `ack_lock`, the lock the sampler takes to read how many
acknowledgements its read will bound: the producer threads keep the bound rule.

A sampler runs every `SAMPLE_S`. It reads the committed metadata end offset, which
becomes the `bound` of every batch acknowledged before the read left (the checker's
"reported after the acknowledgement" rule): from the controller's DescribeCluster on a
SQLite log, from etcd itself (`state/end`, a linearizable read) on an etcd log, because
a standby's answer may lag the log and a bound too early could excuse a silent loss. Its
DescribeCluster's leaderless partitions give a sampled unavailability figure beside the
one computed from the log.

Every controller's /metrics is scraped every `SCRAPE_S`, just before every fault on a
controller or an etcd member, and at the end; `chaos.watch` keeps each term's
`metactl_potential_data_loss_events_total`, whose sum is reported beside the
UncleanRecoveryRecord count (docs/chaos.md, "The metric across restarts and failovers").

Cancelling `ChaosRun.execute` (SIGINT in the CLI) stops producing and faulting; the
processes are always stopped (`finally`), and `chaos.report.build_report` then gives a
partial report.

This module owns the orchestration. It must not decide process details
(`chaos.processes`), the plan (`chaos.plan`), how a fault is carried out (`chaos.faults`)
or a record's fate (`chaos.check`), nor build the report (`chaos.report` reads a finished
run) or draw progress (its caller gives a `Display`); it touches nothing of the brokers'
or the controller's internals: only their wire protocol, signals and /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from chaos.check import TOPIC
from chaos.config import ChaosConfig
from chaos.faults import Faults
from chaos.plan import CONTROLLER_OPS, ETCD_OPS
from chaos.processes import Processes, port_plan
from chaos.read import fetch_metadata, read_logs
from chaos.watch import Watch
from clients.data import Connections, Leaders, leader_request
from clients.producer import AckedLog
from localcluster.procs import await_active_brokers
from metactl.errors import InvalidRequestError, MetactlError
from metadata_log.records import NO_LEADER
from protocol.client import RetryPolicy
from protocol.messages.admin import (
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeClusterResponse,
    ElectLeader,
)
from protocol.messages.data import ACKS_ALL, ProduceRequest, ProduceResponse

if TYPE_CHECKING:
    from chaos.kafka import Delivered, KafkaClients
    from metadata_log.etcd.client import Etcd

SAMPLE_S = 0.2
SCRAPE_S = 0.5
PRODUCE_RETRY = RetryPolicy(attempts=4, base_s=0.05, cap_s=0.5)
FOLLOWER_CATCH_UP_S = 15.0  # librdkafka's follower, after the read-back


class Display(Protocol):
    """Where a run shows its progress (the CLI's progress bar, `ops.run_progress`): its
    events as lines, where it is, and its end."""

    def note(self, text: str) -> None: ...

    def update(
        self, done: float | None = None, status: str | None = None, *, left_s: float | None = None
    ) -> None: ...

    def close(self) -> None: ...


class ChaosRun:
    def __init__(
        self,
        cfg: ChaosConfig,
        bar: Display,
        *,
        on_started: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.bar = bar
        self.on_started = on_started
        self.root: Path = cfg.data_dir.resolve()
        self.procs = Processes(
            root=self.root,
            brokers=cfg.brokers,
            strategy=cfg.strategy,
            elr=cfg.eligible_leader_replicas,
            unclean_leader_election=cfg.unclean_leader_election,
            ports=port_plan(
                cfg.base_port,
                controllers=cfg.controllers,
                etcd=cfg.etcd,
                brokers=cfg.brokers,
                kafka=cfg.client == "librdkafka",
            ),
            etcd_members=cfg.etcd,
            timing=cfg.timing,
        )
        self.t0 = time.monotonic()
        self.watch = Watch(self.procs, cfg.controllers, self.say)
        self.faults = Faults(cfg, self.procs, self.watch, self.say, self.t0)
        self.etcd_client: Etcd | None = None
        self.leaders: list[Leaders] = []
        self.acked_path = self.root / "acked.jsonl"
        self.acks: list[tuple[int, int, int, int]] = []  # partition, base, count, epoch
        self.bounds: list[int | None] = []
        self.ack_values: list[bytes] = []  # with librdkafka: each ack's value (else empty)
        self.ack_lock = threading.Lock()  # producer threads append; the sampler counts
        self.refused: Counter[str] = Counter()
        self.kafka: KafkaClients | None = None
        self.kafka_threads: list[threading.Thread] = []
        self.kafka_failures: list[str] = []  # a client thread's exception
        self.sampled_ms = 0.0
        self.phase = "starting"
        self.interrupted = False
        self.produce_s = 0.0
        self.results: dict[str, Any] = {}

    # --- helpers --------------------------------------------------------------------------

    def say(self, msg: str) -> None:
        self.bar.note(f"[{time.monotonic() - self.t0:7.2f}s] {msg}")

    # --- start ----------------------------------------------------------------------------

    async def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        p = self.procs
        if p.etcd is not None:
            self.say(f"starting a {self.cfg.etcd}-member etcd cluster")
            await p.start_etcd()
            from metadata_log.etcd.client import Etcd
            from metadata_log.etcd.target import EtcdTarget

            assert p.url is not None
            # The admin's etcd certificate, given explicitly: METACTL_ETCD_* play no part.
            target = EtcdTarget.parse(p.url, tls=p.etcd_tls)
            self.etcd_client = await Etcd.connect(target, timeout_s=2.0)
        await asyncio.gather(*(p.start_controller(i) for i in p.controllers))
        await asyncio.gather(*(p.start_broker(b) for b in p.broker))
        cfg = self.cfg
        await await_active_brokers(p.address, cfg.brokers)
        spec = CreateTopic(
            name=TOPIC,
            partitions=cfg.partitions,
            replication_factor=cfg.rf,
            min_isr=cfg.min_isr,
            recovery_strategy=cfg.strategy if cfg.eligible_leader_replicas else None,
        )
        r = await self.watch.request(CreateTopicsRequest(topics=[spec]), 30.0)
        assert isinstance(r, CreateTopicsResponse)
        if r.results[0].error_code:
            res = r.results[0]
            raise InvalidRequestError(f"topic creation failed: {res.error_code}: {res.message}")
        await self.watch.scrape_all()
        await self.watch.wait_for(
            lambda r: (
                len(r.partitions) == cfg.partitions
                and all(x.leader != NO_LEADER and len(x.isr) == cfg.rf for x in r.partitions)
            ),
            "every partition led with a full ISR",
            60.0,
        )
        info: dict[str, Any] = {
            "data_dir": str(self.root),
            "controller": p.address,
            "pids": p.started_pids(),
        }
        log = ""
        if p.url is not None:
            info["metadata_log"] = p.url
            flags = p.etcd_tls.flags() if p.etcd_tls is not None else []
            info["etcd_tls_flags"] = flags  # what `metactl log dump --data-dir URL` needs
            log = f", metadata log {' '.join([p.url, *flags])}"
        pids = ", ".join(f"{name}={pid}" for name, pid in info["pids"].items())
        self.say(f"started: data dir {self.root}, controller {p.address}{log}; pids {pids}")
        if self.on_started is not None:
            self.on_started(info)

    # --- producing and sampling -------------------------------------------------------------

    async def produce_partition(self, leaders: Leaders, log: AckedLog, partition: int) -> None:
        conns = Connections()
        req = ProduceRequest(
            topic=TOPIC, partition=partition, acks=ACKS_ALL, count=self.cfg.batch, timeout_ms=2000
        )
        try:
            while True:
                try:
                    resp = await leader_request(
                        leaders, conns, partition, req, timeout_s=5.0, retry=PRODUCE_RETRY
                    )
                except (MetactlError, OSError, TimeoutError) as exc:
                    self.refused[getattr(exc, "code", type(exc).__name__)] += 1
                    await asyncio.sleep(0.05)  # back off before the next batch
                    continue
                if not isinstance(resp, ProduceResponse):
                    self.refused["UNEXPECTED_RESPONSE"] += 1
                    continue
                log.append(resp, ACKS_ALL)  # durable first ...
                with self.ack_lock:  # ... then it counts
                    self.bounds.append(None)
                    self.acks.append(
                        (resp.partition, resp.base_offset, resp.count, resp.leader_epoch)
                    )
        finally:
            await conns.close()

    async def produce(self) -> None:
        log = AckedLog(self.acked_path)
        groups: dict[int, list[int]] = {}
        for part in range(self.cfg.partitions):
            groups.setdefault(part % self.cfg.producers, []).append(part)

        async def producer(parts: list[int]) -> None:
            leaders = Leaders(self.watch.active_first(), TOPIC, PRODUCE_RETRY)
            self.leaders.append(leaders)
            while True:
                try:
                    await leaders.refresh()
                    break
                except (MetactlError, OSError, TimeoutError):
                    await asyncio.sleep(0.2)  # the controller may be restarting
            await asyncio.gather(*(self.produce_partition(leaders, log, x) for x in parts))

        try:
            await asyncio.gather(*(producer(g) for g in groups.values()))
        finally:
            log.close()

    # --- producing with librdkafka ------------------------------------------------------------

    def record_delivered(self, batch: list[Delivered]) -> None:
        """Count delivery reports already fsynced in the acked log (a producer thread)."""
        with self.ack_lock:
            for partition, offset, value in batch:
                self.bounds.append(None)
                self.ack_values.append(value)
                self.acks.append((partition, offset, 1, -1))  # delivery reports carry no epoch

    def refuse(self, code: str) -> None:
        with self.ack_lock:
            self.refused[code] += 1

    def start_kafka(self) -> None:
        """The producer threads and the follower (`chaos.kafka`)."""
        from chaos.kafka import KafkaClients, ValueLog

        k = KafkaClients(
            bootstrap=self.procs.ports.kafka_bootstrap(),
            partitions=self.cfg.partitions,
            producers=self.cfg.producers,
            log=ValueLog(self.acked_path),
            record=self.record_delivered,
            refused=self.refuse,
        )
        self.kafka = k

        def guarded(name: str, target: Callable[[], None]) -> threading.Thread:
            def body() -> None:
                try:
                    target()
                except Exception as exc:  # a client thread's failure is the run's error
                    self.kafka_failures.append(f"{name}: {type(exc).__name__}: {exc}")

            return threading.Thread(target=body, name=f"chaos-{name}", daemon=True)

        self.kafka_threads = [
            guarded(f"producer-{i}", functools.partial(k.produce, g))
            for i, g in enumerate(k.groups())
        ]
        self.kafka_threads.append(guarded("follower", k.follow))
        for t in self.kafka_threads:
            t.start()

    async def join_kafka(self, *, producers_only: bool) -> None:
        """Stop the producers (they flush what is in flight) and, unless
        `producers_only`, the follower; wait for their threads."""
        k = self.kafka
        if k is None:
            return
        k.stop.set()
        if not producers_only:
            k.stop_following.set()
        for t in self.kafka_threads:
            if producers_only and t.name == "chaos-follower":
                continue
            await asyncio.to_thread(t.join, 60.0)
        if not producers_only:
            k.log.close()

    async def etcd_end(self) -> int | None:
        """The etcd log's committed end offset as etcd holds it now (`state/end`, read
        linearizably: never earlier than any acknowledgement before the read); None if
        etcd did not answer."""
        from metadata_log.etcd.layout import read_state

        assert self.etcd_client is not None
        try:
            _, end, _ = await read_state(self.etcd_client)
        except MetactlError:
            return None
        return end

    async def sample(self) -> None:
        last: tuple[float, int] | None = None
        bounded = 0
        while True:
            with self.ack_lock:
                n = len(self.acks)  # acknowledged (and logged) before the reads leave
            if self.etcd_client is None:
                r = await self.watch.describe()
                end = None if r is None else r.committed_offset
            else:
                end = await self.etcd_end()
                r = await self.watch.describe()
            if end is not None:
                for i in range(bounded, n):
                    self.bounds[i] = end
                bounded = n
            now = time.monotonic()
            if r is not None:
                leaderless = sum(1 for p in r.partitions if p.leader == NO_LEADER)
                if last is not None:
                    self.sampled_ms += last[1] * (now - last[0]) * 1000
                last = (now, leaderless)
            self.show()
            await asyncio.sleep(SAMPLE_S)  # the sampling cadence

    async def scrape_loop(self) -> None:
        while True:
            await self.faults.watch_exits()
            await self.watch.scrape_all()
            for leaders in self.leaders:
                leaders.controller = self.watch.active_first()
            await asyncio.sleep(SCRAPE_S)  # the scraping cadence

    def show(self) -> None:
        counts = Counter(f["kind"] for f in self.faults.log)
        ha = sum(n for k, n in counts.items() if k in CONTROLLER_OPS + ETCD_OPS)
        acked = sum(a[2] for a in self.acks)
        status = f"{self.phase}, {len(self.faults.log)} faults"
        if self.cfg.controllers > 1 or self.cfg.etcd:
            status += f" ({ha} on controllers/etcd)"
        status += f", {acked:,} acknowledged"
        elapsed = self.faults.phase_s or (
            time.monotonic() - self.faults.started_at if self.faults.started_at else 0.0
        )
        done = min(elapsed, self.cfg.duration_s)
        # The fault phase's end is known; the heal and the check take what they take.
        left = self.cfg.duration_s - done if self.phase == "faults" else None
        self.bar.update(done, status, left_s=left)

    # --- heal ------------------------------------------------------------------------

    async def heal(self) -> None:
        await self.faults.undo()
        cfg = self.cfg
        await self.watch.await_active()

        def settled(r: DescribeClusterResponse) -> bool:
            return all(
                x.leader != NO_LEADER or x.recovery_pending == [] for x in r.partitions
            ) and all(not b.fenced for b in r.brokers)

        r = await self.watch.wait_for(
            settled, "a leader (or an operator's decision) everywhere", cfg.heal_timeout_s
        )
        if r is not None and cfg.operator_elect:
            await self.operator_elect(r)
        await self.watch.wait_for(
            lambda r: all(
                x.leader != NO_LEADER and len(x.isr) == len(x.replicas) for x in r.partitions
            ),
            "full ISRs",
            20.0 if r is not None else 1.0,
        )

    async def read_kafka(self, partitions: list[int], errors: dict[int, str]) -> dict[str, Any]:
        """The read-back through Kafka Fetch of the partitions ReadLog could read (a
        partition it could not read stays unreadable), then the follower's counts."""
        from chaos.kafka import read_back

        k = self.kafka
        assert k is not None
        self.say("reading every partition back through Kafka Fetch")
        logs, kafka_errors = await asyncio.to_thread(read_back, k.bootstrap, partitions)
        errors.update(kafka_errors)
        # Let the follower reach the final logs, so that it has had its chance to detect
        # each truncation (bounded: one it misses never catches up).
        for _ in range(int(FOLLOWER_CATCH_UP_S / 0.1)):
            if k.caught_up(logs):
                break
            await asyncio.sleep(0.1)  # polling another thread's progress
        caught_up = k.caught_up(logs)
        await self.join_kafka(producers_only=False)
        return {
            "kafka_logs": logs,
            "consumer_truncations": dict(sorted(k.truncations.items())),
            "consumer_offset_resets": dict(sorted(k.offset_resets.items())),
            "consumer_errors": dict(sorted(k.consumer_errors.items())),
            "truncation_examples": list(k.truncation_examples),
            "producer_restarts": k.producer_restarts,
            "follower_caught_up": caught_up,
        }

    async def operator_elect(self, r: DescribeClusterResponse) -> None:
        """What an operator without log inspection would do: elect the first live
        replica of the LastKnownELR, else of the assignment."""
        live = {b.broker_id for b in r.brokers if not b.fenced}
        for x in r.partitions:
            if x.leader != NO_LEADER:
                continue
            choice = next((b for b in [*x.last_known_elr, *x.replicas] if b in live), None)
            if choice is None:
                continue
            req = ElectLeader(
                topic=TOPIC, partition=x.partition, election_type="unclean", replica=choice
            )
            try:
                await self.watch.request(req, 10.0)
                self.say(f"operator: elected {choice} for {TOPIC}-{x.partition}")
            except MetactlError as exc:
                self.say(f"operator: election for {TOPIC}-{x.partition} failed: {exc}")
        await self.watch.wait_for(
            lambda r: all(x.leader != NO_LEADER for x in r.partitions),
            "the operator's leaders",
            20.0,
        )

    # --- the whole run --------------------------------------------------------------------------

    async def execute(self) -> None:
        """Run to the end (or until cancelled); processes are always stopped."""
        background: list[asyncio.Task[None]] = []
        try:
            self.phase = "starting"
            self.show()
            await self.start()
            self.phase = "faults"
            background = [
                asyncio.create_task(self.sample()),
                asyncio.create_task(self.scrape_loop()),
            ]
            t = time.monotonic()
            if self.cfg.client == "librdkafka":
                self.start_kafka()
                await self.faults.run()
                await self.join_kafka(producers_only=True)  # in-flight reports count too
            else:
                producers = asyncio.create_task(self.produce())
                background.append(producers)
                await self.faults.run()
                producers.cancel()
                await asyncio.gather(producers, return_exceptions=True)
            self.produce_s = time.monotonic() - t
            self.phase = "healing"
            self.show()
            self.say("healing")
            await self.heal()
            self.phase = "checking"
            self.show()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await self.watch.await_active()
            address = self.watch.active_first()
            committed, errors = await read_logs(address)
            kafka: dict[str, Any] = {}
            if self.kafka is not None:
                kafka = await self.read_kafka(sorted(committed), errors)
            records, snapshot_at = await fetch_metadata(address)
            await self.watch.await_active()  # the final term's counter, once more
            watch = self.watch
            self.results = {
                "committed": committed,
                "read_errors": errors,
                "records": records,
                "snapshot_at": snapshot_at,
                "final_metric": sum(watch.term_metric.values()) if watch.scraped else None,
                "end_ms": int(time.time() * 1000),
                **kafka,
            }
            if self.kafka_failures:
                raise RuntimeError(
                    "a Kafka client thread failed: " + "; ".join(self.kafka_failures)
                )
            self.phase = "done"
        except asyncio.CancelledError:
            self.interrupted = True
            if self.produce_s == 0.0:
                self.produce_s = time.monotonic() - self.t0
        finally:
            for task in [*background, *self.faults.restores]:
                task.cancel()
            await asyncio.gather(*background, *self.faults.restores, return_exceptions=True)
            await asyncio.shield(self.join_kafka(producers_only=False))
            self.say("stopping every process")
            if self.etcd_client is not None:
                with contextlib.suppress(MetactlError, OSError):
                    await asyncio.shield(self.etcd_client.close())
            try:
                await asyncio.shield(self.procs.stop_all())
            except BaseException:
                # Cancelled again (a second Ctrl-C) or failed while stopping: the orderly
                # stop may never finish now, so leave nothing running.
                self.procs.kill_all()
                raise
            self.show()
            self.bar.close()
