"""The controller side of ``metactl simulate faults``, the faults, and the verdict.

`FaultSim` extends the data plane of `simulation.faults_cluster.Cluster` and runs one
`Schedule` in virtual time, one event at a time from a heap (no asyncio, no clock):

* the controller is the real event step, `controller.core.step.step`, run as the driver
  runs it: broker requests (RegisterBroker with or without the previous epoch,
  BrokerHeartbeat, AlterPartition, ControlledShutdown, ReplicaLogInfo answers to the
  inspections a step returns), a FenceBroker when a session expires
  (`controller.runtime.sessions.BrokerSessions`, as the service does) and a Tick at every
  deadline a step asks for. Every committed batch goes through the audit's invariant
  checker (`audit.rules.LogChecker`), and every UncleanRecoveryRecord (or election of a
  kind that carries none) is noted as a potential-data-loss report;
* broker processes: each log has a flushed prefix and a page-cache tail; a broker
  flushes every `flush_ms`; a lossy kill keeps only the flushed prefix, a plain kill
  keeps everything, a controlled shutdown flushes and writes the clean-shutdown epoch
  that the next registration presents (mutant a presents it after every kill);
* the schedule's faults and, interleaved with them in virtual time, its lifecycle ops
  (`_op`): each is one operator request stepped at its time, exactly as the CLI would
  send it (AlterConfigs of the topic or the cluster default, AlterPartitionReassignments
  to start or cancel, CreatePartitions, DeleteTopic and the CreateTopic that re-creates
  the topic, with a fresh random id, `for_ms` later, retried until the controller
  accepts it, UnregisterBroker, and an UpdateFeature of eligible.leader.replicas.version
  to the other level and back). Nothing else helps them along: a reassignment
  completes only when the simulated leader's own ISR expansion (AlterPartition, once
  the new replica has copied the log and caught up) makes the target a subset of the
  ISR. Refusals are counted, not failures (an op may name what is gone by then);
* controller failovers (`Fault` kind `failover`): the active controller dies, at once
  or between the first and second slice of its next metadata transaction (its begin
  marker and first slice durable, nothing of it published or answered); for the fault's
  `for_ms` no controller is active (requests go unanswered, no session expires); then a
  standby takes over as `controller.runtime` does: the image is the replay of the
  durable log, an unfinished transaction is aborted first
  (`controller.runtime.driver.unfinished_transaction_abort`), pending recoveries start
  over, and every broker gets a fresh session timeout. Every run ends by checking that
  the controller's state is the replay of the durable log (`_check_log`);
* then healing: at the end of the fault window every cut heals, messages stop being
  lost and every broker restarts; after `heal_ms` the operator elects the best log of
  any partition still without a leader (always needed with the manual strategy); after
  `settle_ms` `_outcome` classifies each acknowledged record against the final leader's
  log: present, lost and reported, lost under the classic rules (in an ELR mode, a
  record a leader elected while a feature cycle had the classic rules on may have
  overwritten: the classic rules' own loss, which a downgrade accepts), or lost
  silently; a record of a topic id that no
  longer exists (deleted, whether or not its name was created again) is counted as
  deleted, not checked: deleting a topic is not losing its records.

It must not change controller rules (it only calls `step`) nor the broker stub's
modules, nor read the clock or iterate a set or dict in hash order where order matters.
"""

from __future__ import annotations

import functools
import heapq
import random
import uuid
from collections.abc import Callable
from typing import Any, Final, Literal

import msgspec

from audit.rules import LogChecker
from brokers_stub.replica_log import ReplicaLog, epoch_at
from controller.core.config import ControllerConfig
from controller.core.recovery.policy import RecoveryPolicy
from controller.core.recovery.registry import load_policies
from controller.core.step import ControllerState, Event, Rules, StepResult, Tick, settle, step
from controller.core.work import WORK_BUDGET
from controller.runtime import driver
from controller.runtime.sessions import BrokerSessions
from metactl.errors import MetactlError, NotControllerError, ReplayError
from metadata_image.image import ClusterImage, TopicPartition
from metadata_image.transactions import LogReplay, replay_log
from metadata_log.records import (
    BROKER_RESOURCE,
    ELR_FEATURE,
    MIN_ISR_CONFIG,
    NO_LEADER,
    TOPIC_RESOURCE,
    FeatureLevelRecord,
    MetadataRecord,
    PartitionChangeRecord,
    UncleanRecoveryRecord,
)
from protocol.messages import (
    AlterConfigs,
    AlterPartitionReassignments,
    AlterPartitionReassignmentsResponse,
    BrokerHeartbeatRequest,
    ControlledShutdown,
    ControlledShutdownResponse,
    CreatePartitions,
    CreateTopic,
    DeleteTopic,
    ElectLeader,
    FenceBroker,
    Reassignment,
    RegisterBroker,
    RegisterBrokerResponse,
    ReplicaLogInfo,
    UnfenceBroker,
    UnregisterBroker,
    UpdateFeature,
)
from simulation.faults_cluster import (
    CONTROLLER,
    PRODUCER,
    RETRY_MS,
    SESSION_CHECK_MS,
    SHUTDOWN_TIMEOUT_MS,
    TICK_MS,
    TOPIC,
    Cluster,
    _Broker,
)
from simulation.faults_schedule import ARM_MS, Fault, Mode, Op, Schedule

# Elections that come with their own UncleanRecoveryRecord, or are clean.
_KNOWN_ELECTIONS: Final = frozenset({"isr", "elr", "preferred", "unclean_recovery", "manual"})
# Rules of the audit that encode KIP-966 itself: classic mode breaks them by design. The
# classic rules also never empty an ISR, unregistering included (as Kafka's classic
# controller): the last member of an ISR stays when it is unregistered.
CLASSIC_EXEMPT_RULES: Final = frozenset(
    {"unclean_replica_in_isr", "unclean_replica_in_elr", "unregistered_broker_kept"}
)


@functools.cache
def _policies() -> dict[str, RecoveryPolicy]:
    """The recovery policies, looked up once per process (entry points read files)."""
    return load_policies()


class Outcome(msgspec.Struct, kw_only=True):
    """What one schedule produced."""

    acknowledged: int = 0
    present: int = 0
    lost_reported: int = 0
    lost_silent: int = 0
    # ELR modes: lost where a leader elected under the classic rules (a feature cycle's
    # downgrade window) may have overwritten it: the classic rules' documented loss.
    lost_classic: int = 0
    unreadable: int = 0  # acknowledged records of partitions without a leader at the end
    deleted: int = 0  # acknowledged records of a topic id deleted since (not checked)
    unavailable_partition_ms: int = 0
    unclean_recoveries: int = 0
    operator_elections: int = 0
    refused_requests: int = 0
    failovers: int = 0  # controller failovers (a standby took over from the durable log)
    aborted_transactions: int = 0  # transactions a failover left open, aborted by the next
    # Lifecycle ops applied and refused, by kind ("reassign", "reassign refused", ...),
    # and what became of reassignments ("reassignment completed", "... cancelled").
    lifecycle: dict[str, int] = {}
    violations: list[str] = []
    silent_examples: list[str] = []

    @property
    def failed(self) -> bool:
        return self.lost_silent > 0 or bool(self.violations)


class FaultSim(Cluster):
    """One schedule, run: the controller side, the faults, and the verdict."""

    def __init__(self, schedule: Schedule, mode: Mode) -> None:
        super().__init__(schedule, mode)
        self.config = ControllerConfig(
            unclean_recovery_strategy=mode.strategy,
            default_min_insync_replicas=schedule.min_isr,
            default_replication_factor=schedule.replication_factor,
            eligible_leader_replicas=mode.eligible_leader_replicas,
            unclean_leader_election=mode.unclean_leader_election,
        )
        budget = mode.work_budget if mode.work_budget is not None else WORK_BUDGET
        self.rules = Rules(self.config, _policies(), work_budget=budget)
        self.core = ControllerState(ClusterImage())
        # The durable metadata log: every record the controllers wrote, in offset order (a
        # failover's new controller replays it, and the run ends by checking that the
        # controller's state is its replay).
        self.durable: list[MetadataRecord] = []
        self.armed: Fault | None = None  # a mid-transaction failover waiting for one
        self.sessions = BrokerSessions(self.config.broker_session_timeout_ms)
        self.checker = LogChecker("faults")
        self.deadlines: set[int] = set()
        # Potential-data-loss reports by (topic id, partition): event sequence numbers.
        self.reports: dict[tuple[str, int], list[int]] = {}
        # Elections under the classic rules by (topic id, partition): event sequence
        # numbers (only the ELR modes' feature cycles make any there).
        self.classic_elections: dict[tuple[str, int], list[int]] = {}
        # Topic ids: random (as the driver draws them), from a stream of their own so that
        # the rest of the run does not depend on how many topics are created.
        self.ids = random.Random(f"metactl-faults-ids:{schedule.seed}")
        self.out = Outcome()
        self.unavail_since = 0

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

    # --- the controller --------------------------------------------------------------------

    def _step(self, event: Event) -> Any:
        """One controller event step; returns the response, or the coded refusal."""
        if not self.ctl_up:
            self.out.refused_requests += 1
            return NotControllerError("no controller is active (a failover is under way)")
        try:
            if self.armed is not None:
                first = step(self.core, event, self.now, self.rules)
                if first.follow_up is not None:  # it opens a transaction: die inside it
                    return self._torn(first)
            result = settle(self.core, event, self.now, self.rules)
        except MetactlError as exc:
            self.out.refused_requests += 1
            return exc
        self._commit(result)
        return result.response

    def _commit(self, result: StepResult) -> None:
        records = result.records
        before = self.core.image
        self.durable.extend(records)
        if records:
            self._account()
            self.checker.feed(before.end_offset, self.now, records)
            self._note_reports(records, before, result.state.image)
        self.core = result.state
        if result.delta.partitions:
            self._note_reassignments(before, result.state.image, result.delta.partitions)
        if result.delta.topics and self.producing:  # (the first ones start in _setup)
            self.start_producers(result.state.image)
        deadline = result.next_deadline_ms
        if deadline is not None and deadline not in self.deadlines:
            self.deadlines.add(deadline)
            self.at(deadline, self._deadline, (deadline, self.ctl_inc))
        if records:
            image = self.core.image
            for b in self.brokers:
                self.send(CONTROLLER, b, self._on_image, (b, image))
        for insp in result.inspections:
            self.send(CONTROLLER, insp.broker_id, self._on_inspection, insp)

    def _note_reports(
        self, records: list[MetadataRecord], before: ClusterImage, after: ClusterImage
    ) -> None:
        """Potential-data-loss events: UncleanRecoveryRecords, and elections of a kind
        that carries none (Kafka's classic unclean leader election), each for the topic
        id its partition had (a report about a topic excuses no loss of its successor)."""

        def report(tp: TopicPartition) -> None:
            t = before.topics.get(tp[0]) or after.topics.get(tp[0])
            if t is not None:
                self.reports.setdefault((t.topic_id, tp[1]), []).append(self.seq)

        recovered: TopicPartition | None = None
        elr = before.elr_enabled(self.config.eligible_leader_replicas)
        for r in records:
            if isinstance(r, FeatureLevelRecord) and r.name == ELR_FEATURE:
                elr = r.level >= 1
            if (
                isinstance(r, PartitionChangeRecord)
                and r.leader is not None
                and not elr
                and self.mode.eligible_leader_replicas
            ):
                t = before.topics.get(r.topic) or after.topics.get(r.topic)
                if t is not None:
                    self.classic_elections.setdefault((t.topic_id, r.partition), []).append(
                        self.seq
                    )
            if isinstance(r, UncleanRecoveryRecord):
                recovered = (r.topic, r.partition)
                self.out.unclean_recoveries += 1
                if r.potential_data_loss:  # one that claims no loss excuses none
                    report(recovered)
            elif isinstance(r, PartitionChangeRecord):
                tp = (r.topic, r.partition)
                kind = r.election
                if kind is not None and str(kind) not in _KNOWN_ELECTIONS and recovered != tp:
                    report(tp)
                    self.out.unclean_recoveries += 1
                recovered = None

    def _note_reassignments(
        self, before: ClusterImage, after: ClusterImage, changed: set[TopicPartition]
    ) -> None:
        """Count the reassignments that ended in a commit: completed (the target is the
        assignment) or cancelled (the original is)."""
        for tp in sorted(changed):
            old, new = before.partition(tp), after.partition(tp)
            if old is None or new is None or not old.reassigning or new.reassigning:
                continue
            outcome = "completed" if new.replicas == old.target else "cancelled"
            self._count(f"reassignment {outcome}")

    def _count(self, what: str) -> None:
        self.out.lifecycle[what] = self.out.lifecycle.get(what, 0) + 1

    def _account(self) -> None:
        offline = len(self.core.image.offline)
        self.out.unavailable_partition_ms += offline * (self.now - self.unavail_since)
        self.unavail_since = self.now

    def _deadline(self, arg: tuple[int, int]) -> None:
        deadline, inc = arg
        if inc != self.ctl_inc:
            return  # a timer of a controller that died since
        self.deadlines.discard(deadline)
        self._step(Tick())

    def _session_check(self, _: None) -> None:
        self.at(self.now + SESSION_CHECK_MS, self._session_check)
        if not self.ctl_up:
            return
        image = self.core.image
        live = [b for b in sorted(image.brokers) if not image.brokers[b].fenced]
        for b in self.sessions.expired(live, self.now):
            self._step(FenceBroker(broker_id=b, reason="session_timeout"))

    def _ctl_request(self, msg: tuple[int, Event, Callable[[Any], None] | None]) -> None:
        src, event, reply = msg
        response = self._step(event)
        if isinstance(event, BrokerHeartbeatRequest):
            if not isinstance(response, MetactlError):
                self.sessions.touch(event.broker_id, self.now)
                self.send(CONTROLLER, src, self._on_image, (src, self.core.image))
            elif response.code == "BROKER_ID_NOT_REGISTERED":
                # Unregistered while it was fenced but alive (cut off): it registers again.
                self.send(CONTROLLER, src, self._unregistered, (src, event.broker_epoch))
        if reply is not None:
            self.send(CONTROLLER, src, reply, response)

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

    # --- controller failover ------------------------------------------------------------

    def _failover(self, f: Fault) -> None:
        """The active controller dies now, or (`mid_transaction`) inside the next
        transaction it opens within `ARM_MS`."""
        if not self.ctl_up or self.armed is not None:
            return  # one failover at a time
        if not f.mid_transaction:
            self._crash(f)
            return
        self.armed = f
        self.at(self.now + ARM_MS, self._arm_expired, f)

    def _arm_expired(self, f: Fault) -> None:
        if self.armed is f:  # no transaction opened meanwhile: die anyway
            self._crash(f)

    def _torn(self, first: StepResult) -> NotControllerError:
        """The controller wrote the first slice of a transaction (its begin marker and
        records are durable, as the driver's committer appends a slice at a time) and died
        before the next: the log now ends inside the transaction. Nothing of it was ever
        published or answered (readers apply a transaction at its end marker)."""
        f = self.armed
        assert f is not None
        self.durable.extend(first.records)
        self._crash(f)
        return NotControllerError("the active controller died")

    def _crash(self, f: Fault) -> None:
        """No controller is active until a standby takes over `for_ms` later; the dead
        one's timers, sessions and in-flight messages are gone with it."""
        self.armed = None
        self.ctl_up = False
        self.ctl_inc += 1
        self.deadlines.clear()
        self.at(self.now + f.for_ms, self._take_over)

    def _take_over(self, _: None) -> None:
        """A standby becomes the active controller as `controller.runtime` does it: the
        image is the replay of the durable log, a transaction the log ends inside is
        aborted first (`driver.unfinished_transaction_abort`, as `Controller.open` does),
        the soft state starts over (no pending recoveries: every leaderless partition is
        evaluated afresh), and every registered broker gets a full session timeout of
        grace (a fresh `BrokerSessions`, as `ControllerService._activate`)."""
        try:
            replayed = replay_log(LogReplay(), self.durable)
        except ReplayError as exc:
            self.out.violations.append(f"log_replay at takeover: {exc.message}")
            replayed = LogReplay(self.core.image)
        abort = driver.unfinished_transaction_abort(replayed)
        if abort is not None:
            self.durable.append(abort)
            replayed = replay_log(replayed, [abort])
            self.out.aborted_transactions += 1
        self.core = ControllerState(replayed.image)
        self.sessions = BrokerSessions(self.config.broker_session_timeout_ms)
        self.ctl_up = True
        self.out.failovers += 1
        self._step(Tick())  # the new driver's first idle moment: the backlog is everything

    def _check_log(self) -> None:
        """The controller's state must be the replay of the durable log (what any new
        controller, broker or tool would rebuild), at the end of every run."""
        try:
            replayed = replay_log(LogReplay(), self.durable)
        except ReplayError as exc:
            self.out.violations.append(f"log_replay: {exc.message}")
            return
        if replayed.transaction is not None or replayed.image != self.core.image:
            open_txn = replayed.transaction
            self.out.violations.append(
                "state_differs_from_log_replay: the controller's image (end offset "
                f"{self.core.image.end_offset}) is not the replay of the durable log "
                f"({len(self.durable)} records, replayed to {replayed.image.end_offset}"
                + (f", transaction {open_txn.name!r} still open" if open_txn else "")
                + ")"
            )

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
        out = self.out
        image = self.core.image
        for _ in image.reassigning:
            self._count("reassignment in progress at the end")
        for topic_id, tp, start, end, epoch, seq in self.acked:
            out.acknowledged += end - start
            t = image.topics.get(tp[0])
            if t is None or t.topic_id != topic_id:
                out.deleted += end - start  # its topic was deleted: nothing to keep
                continue
            p = image.partitions[tp]
            if p.leader == NO_LEADER:
                out.unreadable += end - start
                continue
            log = self.current_log(self.brokers[p.leader], tp, topic_id)
            if log is None:  # the leader does not hold the partition: all of it is gone
                log = ReplicaLog(topic=tp[0], partition=tp[1])
            missing = [
                offset
                for offset in range(start, end)
                if offset >= log.log_end_offset or epoch_at(log.leader_epochs, offset) != epoch
            ]
            out.present += end - start - len(missing)
            if any(r > seq for r in self.reports.get((topic_id, tp[1]), ())):
                out.lost_reported += len(missing)
                continue
            if any(r > seq for r in self.classic_elections.get((topic_id, tp[1]), ())):
                out.lost_classic += len(missing)
                continue
            out.lost_silent += len(missing)
            for offset in missing[: 5 - len(out.silent_examples)]:
                out.silent_examples.append(
                    f"{tp[0]}-{tp[1]} offset {offset} epoch {epoch}: final leader "
                    f"{p.leader} (epoch {p.leader_epoch}) has "
                    f"{log.log_end_offset} records, epochs {log.leader_epochs}"
                )
        exempt = CLASSIC_EXEMPT_RULES if not self.mode.eligible_leader_replicas else frozenset()
        out.violations += [
            f"{v.rule} at offset {v.offset} ({v.topic}-{v.partition}): {v.detail}"
            for checker in self.checker.finish()
            for v in checker.out
            if v.rule not in exempt
        ]
        return out
