"""One ``metactl simulate faults`` schedule, run: the broker processes, the faults, the operator.

`FaultSim` extends the controller side (`simulation.faults_controller.ControllerSide`,
itself over the data plane of `simulation.faults_cluster.Cluster`) and runs one
`Schedule` in virtual time, one event at a time from a heap (no asyncio, no clock):

* broker processes: each log has a flushed prefix and a page-cache tail; a broker
  flushes every `flush_ms`; a lossy kill keeps only the flushed prefix, a plain kill
  keeps everything, a controlled shutdown flushes and writes the clean-shutdown epoch
  that the next registration presents (mutant a presents it after every kill); brokers
  register, heartbeat, answer the controller's log inspections and register again when
  the controller has unregistered them;
* the schedule's faults (kills, shutdowns, cuts and isolations, controller failovers)
  and, interleaved with them in virtual time, its lifecycle ops (`_op`): each is one
  operator request stepped at its time, exactly as the CLI would send it (AlterConfigs
  of the topic or the cluster default, AlterPartitionReassignments to start or cancel,
  CreatePartitions, DeleteTopic and the CreateTopic that re-creates the topic, with a
  fresh random id, `for_ms` later, retried until the controller accepts it,
  UnregisterBroker, and an UpdateFeature of eligible.leader.replicas.version to the
  other level and back). Nothing else helps them along: a reassignment completes only
  when the simulated leader's own ISR expansion (AlterPartition, once the new replica
  has copied the log and caught up) makes the target a subset of the ISR. Refusals are
  counted, not failures (an op may name what is gone by then);
* then healing: at the end of the fault window every cut heals, messages stop being
  lost and every broker restarts; after `heal_ms` the operator elects the best log of
  any partition still without a leader (always needed with the manual strategy); after
  `settle_ms` the run ends and `simulation.faults_verdict.verdict` classifies each
  acknowledged record against the final leader's log.

It must not change controller rules (it only calls `step`, through the controller side)
nor the broker stub's modules, nor read the clock or iterate a set or dict in hash
order where order matters.
"""

from __future__ import annotations

import heapq
import uuid
from typing import Any, Literal

from metactl.errors import MetactlError
from metadata_image.state import TopicPartition
from metadata_log.records import (
    BROKER_RESOURCE,
    ELR_FEATURE,
    MIN_ISR_CONFIG,
    NO_LEADER,
    TOPIC_RESOURCE,
)
from protocol.messages.admin import (
    AlterConfigs,
    AlterPartitionReassignments,
    AlterPartitionReassignmentsResponse,
    CreatePartitions,
    CreateTopic,
    DeleteTopic,
    ElectLeader,
    Reassignment,
    UnregisterBroker,
    UpdateFeature,
)
from protocol.messages.broker_controller import (
    BrokerHeartbeatRequest,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.messages.internal import (
    ControlledShutdown,
    ControlledShutdownResponse,
    ReplicaLogInfo,
    UnfenceBroker,
)
from simulation.faults_cluster import (
    CONTROLLER,
    PRODUCER,
    RETRY_MS,
    SESSION_CHECK_MS,
    SHUTDOWN_TIMEOUT_MS,
    TICK_MS,
    TOPIC,
    _Broker,
)
from simulation.faults_controller import ControllerSide
from simulation.faults_schedule import Fault, Op
from simulation.faults_verdict import Outcome, verdict


class FaultSim(ControllerSide):
    """One schedule, run: the broker processes, the faults, the operator and the verdict."""

    def run(self) -> Outcome:
        self._setup()
        s = self.s
        for f in s.faults:
            self.at(f.at_ms, self._fault, f)
        for op in s.ops:
            self.at(op.at_ms, self._op, op)
        heal = s.fault_window_ms
        self.at(heal, self._heal)
        self.at(heal + s.heal_ms, self._operator)
        end = heal + s.heal_ms + s.settle_ms
        queue = self.queue
        while queue and queue[0][0] <= end:
            when, _, fn, arg = heapq.heappop(queue)
            self.now = when
            self.seq += 1
            fn(arg)
        self.now = end
        self._account()
        self._check_log()
        return self._outcome()

    def _unregistered(self, arg: tuple[int, int]) -> None:
        b = self.brokers[arg[0]]
        if b.up and b.epoch == arg[1]:
            b.epoch, b.view = None, None
            b.leaders.clear()
            b.fetching.clear()
            self._register((b.id, b.inc, None))  # its registration is gone: unclean

    # --- set-up, faults, healing, the operator --------------------------------------------

    def _setup(self) -> None:
        for bid, b in self.brokers.items():
            self._step(RegisterBroker(broker_id=bid, incarnation_id=f"b{bid}-0"))
            epoch = self.core.image.brokers[bid].epoch
            self._step(UnfenceBroker(broker_id=bid, broker_epoch=epoch))
            self.sessions.touch(bid, 0)
            b.up, b.epoch, b.last_epoch = True, epoch, epoch
        # The topic follows the cluster default (the config's, s.min_isr), so that both
        # the topic's and the cluster's min.insync.replicas changes apply to it.
        self._step(self._create_topic())
        image = self.core.image
        self.refresh_producers()
        for b in self.brokers.values():
            self._on_image((b.id, image))  # every broker creates its (empty) replicas
            self._start_timers(b)
        self.start_producers(image)
        self.at(SESSION_CHECK_MS, self._session_check)

    def _create_topic(self) -> CreateTopic:
        return CreateTopic(
            name=TOPIC,
            partitions=self.s.partitions,
            replication_factor=self.s.replication_factor,
            topic_id=str(uuid.UUID(int=self.ids.getrandbits(128), version=4)),
        )

    def _start_timers(self, b: _Broker) -> None:
        inc = b.inc
        self.at(self.now + self.rnd.randrange(TICK_MS), self._broker_tick, (b.id, inc))
        self.at(self.now + self.rnd.randrange(1, 2_000), self._heartbeat, (b.id, inc))
        flush = self.s.flush_ms[b.id - 1]
        self.at(self.now + self.rnd.randrange(1, flush), self._flush, (b.id, inc))

    def _fault(self, f: Fault) -> None:
        if f.kind == "failover":
            self._failover(f)
            return
        if f.kind in ("isolate", "cut"):
            pairs = self._pairs(f)
            self._cut(pairs, 1)
            self.at(self.now + f.for_ms, lambda _: self._cut(pairs, -1))
            return
        b = self.brokers[f.broker]
        if not b.up:
            return
        if f.kind == "shutdown":
            if b.epoch is not None and b.stopping is None:
                b.stopping = self.now
                self._shutdown_attempt((b.id, b.inc, f.for_ms))
            return
        lossy = f.kind == "lossy_kill"
        self._stop(b, lossy=lossy, clean=False)
        self.at(self.now + f.for_ms, self._restart, (b.id, b.inc))

    def _pairs(self, f: Fault) -> list[tuple[int, int]]:
        if f.kind == "cut":
            assert f.peer is not None
            return [(f.broker, f.peer)]
        others = [x for x in self.brokers if x != f.broker]
        if f.scope == "controller":
            return [(f.broker, CONTROLLER)]
        if f.scope == "brokers":
            return [(f.broker, x) for x in others]
        return [(f.broker, x) for x in [CONTROLLER, PRODUCER, *others]]

    def _heal(self, _: None) -> None:
        self.cuts.clear()
        self.healed = True
        self.drop = 0.0
        for b in self.brokers.values():
            if not b.up:
                self._restart((b.id, b.inc))

    def _op(self, op: Op) -> None:
        """One lifecycle operation, stepped as the operator's request (see `Op`)."""
        if not self.ctl_up:  # a failover is under way: the operator's request fails
            self._count(f"{op.kind} without a controller")
            return
        image = self.core.image
        topic = image.topics.get(TOPIC)
        event: Any
        if op.kind == "topic_min_isr":
            event = AlterConfigs(
                resource_type=TOPIC_RESOURCE,
                resource_name=TOPIC,
                set_configs={} if op.value is None else {MIN_ISR_CONFIG: str(op.value)},
                delete_configs=[MIN_ISR_CONFIG] if op.value is None else [],
            )
        elif op.kind == "cluster_min_isr":
            event = AlterConfigs(
                resource_type=BROKER_RESOURCE,
                resource_name="",
                set_configs={MIN_ISR_CONFIG: str(op.value)},
            )
        elif op.kind in ("reassign", "cancel_reassignment"):
            assert op.partition is not None
            change = Reassignment(topic=TOPIC, partition=op.partition, replicas=op.replicas)
            event = AlterPartitionReassignments(reassignments=[change])
        elif op.kind == "add_partitions":
            count = (topic.partitions if topic is not None else 0) + (op.value or 1)
            event = CreatePartitions(topic=TOPIC, count=count)
        elif op.kind == "delete_topic":
            event = DeleteTopic(name=TOPIC)
        elif op.kind == "elr_feature_cycle":
            self._feature_cycle(op.for_ms or 0)
            return
        else:
            assert op.broker is not None
            event = UnregisterBroker(broker_id=op.broker)
        response = self._step(event)
        refused = isinstance(response, MetactlError) or (
            isinstance(response, AlterPartitionReassignmentsResponse)
            and any(r.error_code is not None for r in response.results)
        )
        self._count(f"{op.kind} refused" if refused else op.kind)
        if op.kind == "reassign" and not refused:
            tp = (TOPIC, op.partition or 0)
            old, new = image.partition(tp), self.core.image.partition(tp)
            if new is not None and new.reassigning:
                self._count("reassignment started")
            elif old is not None and new is not None and old.replicas != new.replicas:
                self._count("reassignment completed at once")
        if op.kind == "delete_topic" and not refused:
            self.at(self.now + (op.for_ms or 0), self._recreate)

    def _feature_cycle(self, for_ms: int) -> None:
        """eligible.leader.replicas.version to the other level now, and back `for_ms`
        later (retried until the controller takes it), so the run ends on the mode's
        level."""
        elr = self.core.image.elr_enabled(self.config.eligible_leader_replicas)
        if self._set_elr(0 if elr else 1):
            self.at(self.now + for_ms, self._restore_elr)

    def _set_elr(self, level: int) -> bool:
        kind: Literal["upgrade", "downgrade"] = "downgrade" if level == 0 else "upgrade"
        response = self._step(UpdateFeature(name=ELR_FEATURE, level=level, upgrade_type=kind))
        refused = isinstance(response, MetactlError)
        self._count(f"elr {kind} refused" if refused else f"elr {kind}")
        return not refused

    def _restore_elr(self, _: None) -> None:
        """Back to the mode's own level; retried while no controller is active."""
        level = 1 if self.mode.eligible_leader_replicas else 0
        if self.core.image.elr_enabled(self.config.eligible_leader_replicas) == bool(level):
            return
        if not self.ctl_up or not self._set_elr(level):
            self.at(self.now + RETRY_MS, self._restore_elr)

    def _recreate(self, _: None) -> None:
        """Create the deleted topic again (a new random id); retried until accepted."""
        if TOPIC in self.core.image.topics:
            return
        if isinstance(self._step(self._create_topic()), MetactlError):
            self.at(self.now + RETRY_MS, self._recreate)
        else:
            self._count("recreate_topic")

    def _best_log(self, b: _Broker, tp: TopicPartition) -> tuple[int, int]:
        """(last leader epoch, LEO) of the broker's log of `tp`, as its GetReplicaLogInfo
        answer says: (-1, 0) without one. The request names no topic id, so a broker
        whose metadata names the topic answers only from a log of that id; one that has
        no metadata yet (just restarted) answers from whatever log it holds."""
        log = b.logs.get(tp)
        if b.view is not None:
            t = b.view.topics.get(tp[0])
            log = None if t is None else self.current_log(b, tp, t.topic_id)
        return (-1, 0) if log is None else (log.last_leader_epoch, log.log_end_offset)

    def _operator(self, _: None) -> None:
        """Elect the best log (by last leader epoch, then LEO, as GetReplicaLogInfo shows
        it) of every partition still without a leader, as an operator would."""
        image = self.core.image
        for tp in [(t, i) for t in sorted(image.topics) for i in range(image.topics[t].partitions)]:
            p = image.partitions[tp]
            if p.leader != NO_LEADER:
                continue
            live = [r for r in p.replicas if image.is_active(r) and r not in p.adding]
            if not live:
                continue
            best = max(
                live,
                key=lambda r: (*self._best_log(self.brokers[r], tp), -p.replicas.index(r)),
            )
            request = ElectLeader(
                topic=tp[0], partition=tp[1], election_type="unclean", replica=best
            )
            if not isinstance(self._step(request), MetactlError):
                self.out.operator_elections += 1

    # --- broker processes ----------------------------------------------------------------

    def _stop(self, b: _Broker, *, lossy: bool, clean: bool) -> None:
        for log in b.logs.values():
            if clean or not lossy:
                log.flushed_offset = log.log_end_offset  # flushed, or the OS will
            else:
                log.lose_unflushed()
        b.clean_file = b.epoch if clean else None
        b.up = False
        b.inc += 1
        b.epoch, b.view, b.stopping = None, None, None
        b.leaders.clear()
        b.fetching.clear()
        b.active_epochs = {}

    def _restart(self, key: tuple[int, int]) -> None:
        b = self.brokers[key[0]]
        if b.up or b.inc != key[1]:
            return
        b.up = True
        b.inc += 1
        previous = b.clean_file
        if self.mode.lie_clean_shutdown:
            previous = b.last_epoch  # mutant (a): every restart claims a clean shutdown
        b.clean_file = None
        self._register((b.id, b.inc, previous))
        self._start_timers(b)

    def _register(self, arg: tuple[int, int, int | None]) -> None:
        b = self._alive(arg[:2])
        if b is None or b.epoch is not None:
            return
        incarnation = f"b{b.id}-{b.inc}"
        req = RegisterBroker(broker_id=b.id, incarnation_id=incarnation, previous_epoch=arg[2])
        self.to_controller(b, req, lambda resp: self._registered(b, resp))
        self.at(self.now + RETRY_MS, self._register, arg)

    def _registered(self, b: _Broker, resp: Any) -> None:
        if isinstance(resp, RegisterBrokerResponse) and b.epoch is None:
            b.epoch = b.last_epoch = resp.broker_epoch
            self._roles(b)

    def _shutdown_attempt(self, arg: tuple[int, int, int]) -> None:
        b = self._alive(arg[:2])
        if b is None or b.stopping is None or b.epoch is None:
            return
        if self.now - b.stopping >= SHUTDOWN_TIMEOUT_MS:
            self._finish_shutdown(b, arg[2])
            return
        req = ControlledShutdown(broker_id=b.id, broker_epoch=b.epoch)
        down_ms = arg[2]

        def answer(resp: Any) -> None:
            if isinstance(resp, ControlledShutdownResponse) and resp.can_stop and b.up:
                self._finish_shutdown(b, down_ms)

        self.to_controller(b, req, answer)
        self.at(self.now + RETRY_MS, self._shutdown_attempt, arg)

    def _finish_shutdown(self, b: _Broker, down_ms: int) -> None:
        if b.stopping is None:
            return
        self._stop(b, lossy=False, clean=True)
        self.at(self.now + down_ms, self._restart, (b.id, b.inc))

    def _heartbeat(self, key: tuple[int, int]) -> None:
        b = self._alive(key)
        if b is None:
            return
        self.at(self.now + self.config.broker_heartbeat_interval_ms, self._heartbeat, key)
        if b.epoch is not None:
            offset = b.view.end_offset if b.view is not None else 0
            req = BrokerHeartbeatRequest(
                broker_id=b.id, broker_epoch=b.epoch, metadata_offset=offset
            )
            self.to_controller(b, req)

    def _flush(self, key: tuple[int, int]) -> None:
        b = self._alive(key)
        if b is None:
            return
        self.at(self.now + self.s.flush_ms[b.id - 1], self._flush, key)
        for log in b.logs.values():
            log.flushed_offset = log.log_end_offset

    def _on_inspection(self, insp: Any) -> None:
        b = self.brokers[insp.broker_id]
        if b.epoch is None or b.epoch != insp.broker_epoch:
            return
        # GetReplicaLogInfo names no topic id: the broker answers about its log of the
        # topic its metadata names (none, -1 and 0, if its log is of another id).
        last_leader_epoch, leo = self._best_log(b, (insp.topic, insp.partition))
        answer = ReplicaLogInfo(
            broker_id=b.id,
            broker_epoch=b.epoch,
            topic=insp.topic,
            partition=insp.partition,
            last_leader_epoch=last_leader_epoch,
            log_end_offset=leo,
        )
        self.to_controller(b, answer)

    # --- the verdict -------------------------------------------------------------------------

    def _outcome(self) -> Outcome:
        return verdict(
            self.out,
            self.core.image,
            self.acked,
            lambda broker, tp, topic_id: self.current_log(self.brokers[broker], tp, topic_id),
            self.reports,
            self.classic_elections,
            self.checker.finish(),
            elr=self.mode.eligible_leader_replicas,
        )
