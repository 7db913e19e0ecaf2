"""The simulated cluster of ``metactl simulate history``: its brokers and random processes.

This module owns `_Sim`: the controller's state driven one event step at a time
(`controller.core.step.step`, exactly as the driver runs it, with virtual time), the
queue of timed events, the broker lifecycle and the random processes listed in
`simulation.history` (restarts, crashes, blips, outages, ISR changes, elections and
operators), and the batches of records each step produced, with their timestamps.

It does not write or read a log, sleep or read the clock: `simulation.history` runs the
event loop and appends the batches to the store. Everything random comes from the one
seeded `random.Random` of the simulation.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from typing import Any

from controller.core.config import ControllerConfig
from controller.core.recovery.registry import load_policies
from controller.core.recovery.tracker import Inspection, RecoveryTracker
from controller.core.step import ControllerState, Event, Rules, Tick, settle
from metactl.errors import MetactlError
from metadata_image.delta import MetadataDelta
from metadata_image.image import ClusterImage
from metadata_image.state import PartitionState, TopicPartition
from metadata_log.records import (
    NO_LEADER,
    MetadataRecord,
)
from protocol.messages.admin import CreateTopic, ElectLeader
from protocol.messages.broker_controller import AlterPartition, IsrMember, RegisterBroker
from protocol.messages.internal import (
    ControlledShutdown,
    FenceBroker,
    ReplicaLogInfo,
    UnfenceBroker,
)
from protocol.messages.unions import ControllerRequest
from simulation.history_config import DAY_MS, MINUTE_MS, HistoryConfig


class _Sim:
    def __init__(self, cfg: HistoryConfig) -> None:
        self.cfg = cfg
        self.rnd = random.Random(cfg.seed)
        self.config = ControllerConfig(
            unclean_recovery_strategy=cfg.strategy,
            default_min_insync_replicas=cfg.min_isr,
            default_replication_factor=cfg.replication_factor,
        )
        self.policies = load_policies()
        self.rules = Rules(self.config, self.policies)
        self.core = ControllerState(ClusterImage())  # the controller's state
        self.now = cfg.start_ms
        self.end = cfg.start_ms + int(cfg.days * DAY_MS)
        self.batches: list[tuple[list[MetadataRecord], int]] = []
        self.queue: list[tuple[int, int, str, Any]] = []
        self.seq = itertools.count()
        self.report_events: dict[str, int] = {}
        self.refused = 0
        self.recoveries = 0
        self.state: dict[int, str] = {}
        self.gen: dict[int, int] = {}
        self.pending_count = 0
        self.deadlines: set[int] = set()
        self.ready_at: dict[int, int] = {}  # broker -> when its replicas have caught up
        self.lagging: dict[tuple[TopicPartition, int], int] = {}  # replica -> caught up at
        self.under_replicated: set[TopicPartition] = set()
        self.not_preferred: set[TopicPartition] = set()
        self.operator_scheduled: set[TopicPartition] = set()
        self.incarnations: dict[int, int] = {}

    # --- the controller core, as the driver runs it ----------------------------------

    @property
    def image(self) -> ClusterImage:
        return self.core.image

    @property
    def tracker(self) -> RecoveryTracker:
        return self.core.tracker

    def submit(self, *requests: ControllerRequest) -> bool:
        """Handle requests in order, one event step each; True if all held."""
        ok = True
        for req in requests:
            ok = self._step(req) and ok
        return ok

    def _step(self, event: Event) -> bool:
        try:
            result = settle(self.core, event, self.now, self.rules)
        except MetactlError:
            self.refused += 1
            return False
        self.core = result.state
        deadline = result.next_deadline_ms
        if deadline is not None and deadline not in self.deadlines:
            self.deadlines.add(deadline)
            self.at(deadline, "deadline", deadline)
        self._emit(result.records, result.delta)
        if result.inspections:
            self._answer(result.inspections)
        return True

    def _answer(self, inspections: list[Inspection]) -> None:
        answers: list[ReplicaLogInfo] = []
        # Sorted: the random log positions must not depend on hash (map) iteration order.
        for insp in sorted(inspections, key=lambda i: (i.topic, i.partition, i.broker_id)):
            b = self.image.broker(insp.broker_id)
            if b is None or not b.active or b.epoch != insp.broker_epoch:
                continue
            tp = (insp.topic, insp.partition)
            p = self.image.partitions[tp]
            lle = max(0, p.leader_epoch - self.rnd.choice((0, 0, 0, 1, 1, 2)))
            leo = self.rnd.randrange(0, 100_000)
            answers.append(
                ReplicaLogInfo(
                    broker_id=insp.broker_id,
                    broker_epoch=insp.broker_epoch,
                    topic=insp.topic,
                    partition=insp.partition,
                    last_leader_epoch=lle,
                    log_end_offset=leo,
                )
            )
        if answers:
            self.submit(*answers)

    def _emit(self, records: list[MetadataRecord], delta: MetadataDelta) -> None:
        if not records:
            return
        # Candidates for the ISR and preferred-leader sweeps, which re-check the image.
        self.under_replicated |= delta.partitions
        self.not_preferred.update(e.tp for e in delta.elections)
        self.recoveries += len(delta.unclean_recoveries)
        if self.batches and self.batches[-1][1] == self.now:
            self.batches[-1][0].extend(records)
        else:
            self.batches.append((list(records), self.now))
        self.pending_count += len(records)

    # --- scheduling ------------------------------------------------------------------

    def at(self, when: int, kind: str, arg: Any) -> None:
        heapq.heappush(self.queue, (max(when, self.now), next(self.seq), kind, arg))

    def exp_ms(self, per_day: float) -> int:
        """A Poisson inter-arrival time for `per_day` events per day."""
        rate = per_day * self.cfg.intensity
        if rate <= 0:
            return self.end - self.now + 1
        return max(1, int(self.rnd.expovariate(rate / DAY_MS)))

    def incarnation(self, broker: int) -> str:
        n = self.incarnations.get(broker, 0) + 1
        self.incarnations[broker] = n
        return f"sim-broker-{broker}-{n}"

    def epoch(self, broker: int) -> int:
        b = self.image.broker(broker)
        return -1 if b is None else b.epoch

    def count(self, kind: str) -> None:
        self.report_events[kind] = self.report_events.get(kind, 0) + 1

    # --- set-up ------------------------------------------------------------------------

    def setup(self) -> None:
        cfg = self.cfg
        racks = ("rack-a", "rack-b", "rack-c")
        for b in range(1, cfg.brokers + 1):
            self.submit(
                RegisterBroker(
                    broker_id=b, incarnation_id=self.incarnation(b), rack=racks[b % len(racks)]
                )
            )
            self.submit(UnfenceBroker(broker_id=b, broker_epoch=self.epoch(b)))
            self.state[b], self.gen[b] = "up", 0
            self.ready_at[b] = self.now
        topics = cfg.topics or max(1, cfg.partitions // 100)
        base, extra = divmod(cfg.partitions, topics)
        for t in range(topics):
            n = base + (1 if t < extra else 0)
            if n == 0:
                continue
            roll = self.rnd.random()
            strategy = "proactive" if roll < 0.1 else "manual" if roll < 0.15 else None
            self.submit(
                CreateTopic(
                    name=f"topic-{t:04d}",
                    partitions=n,
                    replication_factor=min(cfg.replication_factor, cfg.brokers),
                    min_isr=cfg.min_isr,
                    recovery_strategy=strategy,
                )
            )
        self.under_replicated.clear()
        self.not_preferred.clear()
        for b in range(1, cfg.brokers + 1):
            self.at(self.now + self.exp_ms(cfg.controlled_restarts), "controlled_restart", b)
            self.at(self.now + self.exp_ms(cfg.crashes), "crash", b)
            self.at(self.now + self.exp_ms(cfg.blips), "blip", b)
        self.at(self.now + self.exp_ms(cfg.outages), "outage", None)
        self.at(self.now + self.exp_ms(cfg.shrinks_per_partition * cfg.partitions), "shrink", None)
        self.at(self.now + 5 * MINUTE_MS, "isr_sweep", None)
        self.at(self.now + 60 * MINUTE_MS, "preferred_sweep", None)

    # --- events ------------------------------------------------------------------------

    def run_event(self, kind: str, arg: Any) -> None:
        handler: Callable[[Any], None] = getattr(self, f"on_{kind}")
        handler(arg)

    def _reschedule(self, kind: str, broker: int, per_day: float) -> None:
        self.at(self.now + self.exp_ms(per_day), kind, broker)

    # Broker lifecycle: state "up", "blip" (fenced, process alive) or "down". Every
    # transition bumps the broker's generation; events of an older generation are void.

    def _next_gen(self, b: int, state: str) -> int:
        self.state[b] = state
        self.gen[b] += 1
        return self.gen[b]

    def on_controlled_restart(self, b: int) -> None:
        self._reschedule("controlled_restart", b, self.cfg.controlled_restarts)
        if self.state[b] != "up" or not self.image.is_active(b):
            return
        self.count("controlled_restart")
        self.submit(ControlledShutdown(broker_id=b, broker_epoch=self.epoch(b)))
        g = self._next_gen(b, "down")
        self.at(self.now + self.rnd.randrange(20_000, 180_000), "restart", (b, g, True))

    def on_crash(self, b: int) -> None:
        self._reschedule("crash", b, self.cfg.crashes)
        if self.state[b] == "down":
            return
        self.count("crash")
        g = self._crash(b)
        delay = int(self.rnd.expovariate(1 / (5 * MINUTE_MS)))
        self.at(self.now + delay, "restart", (b, g, False))

    def _crash(self, b: int) -> int:
        if not self.image.brokers[b].fenced:
            self.submit(FenceBroker(broker_id=b, reason="session_timeout"))
        return self._next_gen(b, "down")

    def on_blip(self, b: int) -> None:
        self._reschedule("blip", b, self.cfg.blips)
        if self.state[b] != "up" or not self.image.is_active(b):
            return
        self.count("blip")
        self.submit(FenceBroker(broker_id=b, reason="session_timeout"))
        g = self._next_gen(b, "blip")
        self.at(self.now + self.rnd.randrange(2_000, 60_000), "unfence", (b, g))

    def on_outage(self, _: None) -> None:
        self.at(self.now + self.exp_ms(self.cfg.outages), "outage", None)
        n = self.cfg.brokers
        size = min(n, max(self.cfg.replication_factor, n // 6))
        first = self.rnd.randrange(n)
        # Neighbours in the placement order (racks interleaved, as `create_topic` places
        # replicas) share partitions, so losing a run of them empties ISRs and ELRs.
        racks: dict[str, list[int]] = {}
        for b in sorted(self.image.brokers):
            racks.setdefault(self.image.brokers[b].rack or "", []).append(b)
        columns = [racks[r] for r in sorted(racks)]
        order = [c[i] for i in range(max(map(len, columns))) for c in columns if i < len(c)]
        victims = [order[(first + i) % n] for i in range(size)]
        self.count("outage")
        for i, b in enumerate(victims):
            self.at(self.now + i * self.rnd.randrange(200, 3000), "outage_down", b)

    def on_outage_down(self, b: int) -> None:
        if self.state[b] == "down":
            return
        g = self._crash(b)
        self.at(self.now + self.rnd.randrange(MINUTE_MS, 20 * MINUTE_MS), "restart", (b, g, False))

    def on_restart(self, arg: tuple[int, int, bool]) -> None:
        b, g, clean = arg
        if self.gen[b] != g:
            return
        previous = self.epoch(b) if clean else None
        self.submit(
            RegisterBroker(
                broker_id=b,
                incarnation_id=self.incarnation(b),
                previous_epoch=previous,
                rack=self.image.brokers[b].rack,
            )
        )
        self.at(self.now + self.rnd.randrange(1_000, 30_000), "unfence", (b, g))

    def on_unfence(self, arg: tuple[int, int]) -> None:
        b, g = arg
        if self.gen[b] != g:
            return
        broker = self.image.brokers[b]
        if broker.fenced:
            self.submit(UnfenceBroker(broker_id=b, broker_epoch=broker.epoch))
        self._next_gen(b, "up")
        self.ready_at[b] = self.now + self.rnd.randrange(10_000, 10 * MINUTE_MS)

    def on_shrink(self, _: None) -> None:
        cfg = self.cfg
        self.at(self.now + self.exp_ms(cfg.shrinks_per_partition * cfg.partitions), "shrink", None)
        topic = f"topic-{self.rnd.randrange(len(self.image.topics)):04d}"
        t = self.image.topics.get(topic)
        if t is None:
            return
        p = self.image.partitions[(topic, self.rnd.randrange(t.partitions))]
        followers = sorted(p.isr - {p.leader})
        if p.leader == NO_LEADER or not followers or not self.image.is_active(p.leader):
            return
        slow = self.rnd.choice(followers)
        if self.submit(self._alter(p, p.isr - {slow})):
            self.count("shrink")
            self.lagging[(p.tp, slow)] = self.now + self.rnd.randrange(5_000, 15 * MINUTE_MS)

    def _alter(self, p: PartitionState, isr: frozenset[int]) -> AlterPartition:
        return AlterPartition(
            topic=p.topic,
            partition=p.partition,
            leader=p.leader,
            broker_epoch=self.epoch(p.leader),
            partition_epoch=p.partition_epoch,
            leader_epoch=p.leader_epoch,
            isr=[IsrMember(broker_id=r, broker_epoch=self.epoch(r)) for r in sorted(isr)],
        )

    def on_isr_sweep(self, _: None) -> None:
        """Expand ISRs where replicas have caught up; recovering leaders finish recovering."""
        self.at(self.now + 5 * MINUTE_MS, "isr_sweep", None)
        requests: list[ControllerRequest] = []
        done: list[TopicPartition] = []
        image = self.image
        for tp in sorted(self.under_replicated):
            p = image.partitions[tp]
            if p.leader == NO_LEADER:
                self._maybe_operator(p)
                continue
            if not image.is_active(p.leader):
                continue
            missing = [r for r in p.replicas if r not in p.isr]
            if not missing and not p.recovery_state.value:
                done.append(tp)
                continue
            back = {
                r
                for r in missing
                if image.is_active(r)
                and self.now >= self.ready_at.get(r, 0)
                and self.now >= self.lagging.get((tp, r), 0)
            }
            if back or p.recovery_state.value:
                requests.append(self._alter(p, p.isr | back))
        for tp in done:
            self.under_replicated.discard(tp)
        if requests:
            self.count("isr_sweep")
            self.submit(*requests)

    def _maybe_operator(self, p: PartitionState) -> None:
        if p.tp in self.operator_scheduled:
            return
        t = self.image.topics[p.topic]
        strategy = t.recovery_strategy or self.config.unclean_recovery_strategy
        awaited = self.tracker.awaited(self.image, p.tp, self.policies)
        if strategy == "manual" or (awaited == [] and not p.last_known_elr and not p.elr):
            self.operator_scheduled.add(p.tp)
            delay = int(self.rnd.expovariate(1 / (20 * MINUTE_MS)))
            self.at(self.now + delay, "operator", p.tp)

    def on_operator(self, tp: TopicPartition) -> None:
        self.operator_scheduled.discard(tp)
        p = self.image.partitions[tp]
        if p.leader != NO_LEADER:
            return
        active = [r for r in p.replicas if self.image.is_active(r)]
        if not active:
            self.operator_scheduled.add(tp)
            self.at(self.now + 10 * MINUTE_MS, "operator", tp)
            return
        self.count("operator_election")
        self.submit(
            ElectLeader(
                topic=tp[0],
                partition=tp[1],
                election_type="unclean",
                replica=self.rnd.choice(active),
            )
        )

    def on_preferred_sweep(self, _: None) -> None:
        self.at(self.now + 60 * MINUTE_MS, "preferred_sweep", None)
        requests: list[ControllerRequest] = []
        image = self.image
        for tp in sorted(self.not_preferred):
            p = image.partitions[tp]
            preferred = p.replicas[0]
            if p.leader == preferred:
                self.not_preferred.discard(tp)
            elif preferred in p.isr and image.is_active(preferred):
                requests.append(
                    ElectLeader(topic=tp[0], partition=tp[1], election_type="preferred")
                )
                self.not_preferred.discard(tp)
        if requests:
            self.count("preferred_sweep")
            self.submit(*requests)

    def on_deadline(self, deadline: int) -> None:
        self.deadlines.discard(deadline)
        self._step(Tick())
