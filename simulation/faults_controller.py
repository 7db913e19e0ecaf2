"""The controller side of ``metactl simulate faults``: the real controller step, and failovers.

`ControllerSide` extends the data plane of `simulation.faults_cluster.Cluster` with the
active controller, run as the driver runs it, in virtual time:

* the controller is the real event step, `controller.core.step.step`: broker requests
  (RegisterBroker with or without the previous epoch, BrokerHeartbeat, AlterPartition,
  ControlledShutdown, ReplicaLogInfo answers to the inspections a step returns) and the
  operator's requests are stepped as they arrive (`_step`), a FenceBroker when a session
  expires (`controller.runtime.sessions.BrokerSessions`, as the service does) and a Tick
  at every deadline a step asks for. Every committed batch goes to the durable log and
  through the audit's invariant checker (`audit.log_checker.LogChecker`), and every
  UncleanRecoveryRecord (or election of a kind that carries none) is noted as a
  potential-data-loss report (`_note_reports`);
* controller failovers (`Fault` kind `failover`): the active controller dies, at once
  or between the first and second slice of its next metadata transaction (its begin
  marker and first slice durable, nothing of it published or answered); for the fault's
  `for_ms` no controller is active (requests go unanswered, no session expires); then a
  standby takes over as `controller.runtime` does: the image is the replay of the
  durable log, an unfinished transaction is aborted first
  (`controller.runtime.driver.unfinished_transaction_abort`), pending recoveries start
  over, and every broker gets a fresh session timeout. Every run ends by checking that
  the controller's state is the replay of the durable log (`_check_log`).

What the brokers do when the controller answers (register again after an
unregistration, answer a log inspection) is `simulation.faults_sim.FaultSim`'s, as are
the faults, the operator and the run itself. It must not change controller rules (it
only calls `step`), nor read the clock or iterate a set or dict in hash order where
order matters.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any, Final

from audit.log_checker import LogChecker
from controller.core.config import ControllerConfig
from controller.core.recovery.policy import RecoveryPolicy
from controller.core.recovery.registry import load_policies
from controller.core.step import ControllerState, Event, Rules, StepResult, Tick, settle, step
from controller.core.work import WORK_BUDGET
from controller.runtime import driver
from controller.runtime.sessions import BrokerSessions
from metactl.errors import MetactlError, NotControllerError, ReplayError
from metadata_image.image import ClusterImage
from metadata_image.state import TopicPartition
from metadata_image.transactions import LogReplay, replay_log
from metadata_log.records import (
    ELR_FEATURE,
    FeatureLevelRecord,
    MetadataRecord,
    PartitionChangeRecord,
    UncleanRecoveryRecord,
)
from protocol.messages.broker_controller import BrokerHeartbeatRequest
from protocol.messages.internal import FenceBroker
from simulation.faults_cluster import CONTROLLER, SESSION_CHECK_MS, Cluster
from simulation.faults_schedule import ARM_MS, Fault, Mode, Schedule
from simulation.faults_verdict import Outcome

# Elections that come with their own UncleanRecoveryRecord, or are clean.
_KNOWN_ELECTIONS: Final = frozenset({"isr", "elr", "preferred", "unclean_recovery", "manual"})


@functools.cache
def _policies() -> dict[str, RecoveryPolicy]:
    """The recovery policies, looked up once per process (entry points read files)."""
    return load_policies()


class ControllerSide(Cluster):
    """The active controller of one run (and the standby that takes over from it)."""

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
        id its partition had (a report about a topic excuses no loss of its successor);
        and, in an ELR mode, elections under a feature cycle's classic rules."""

        def note(book: dict[tuple[str, int], list[int]], tp: TopicPartition) -> None:
            t = before.topics.get(tp[0]) or after.topics.get(tp[0])
            if t is not None:
                book.setdefault((t.topic_id, tp[1]), []).append(self.seq)

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
                note(self.classic_elections, (r.topic, r.partition))
            if isinstance(r, UncleanRecoveryRecord):
                recovered = (r.topic, r.partition)
                self.out.unclean_recoveries += 1
                if r.potential_data_loss:  # one that claims no loss excuses none
                    note(self.reports, recovered)
            elif isinstance(r, PartitionChangeRecord):
                tp = (r.topic, r.partition)
                kind = r.election
                if kind is not None and str(kind) not in _KNOWN_ELECTIONS and recovered != tp:
                    note(self.reports, tp)
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
        """A heartbeat of broker `arg[0]` at epoch `arg[1]` met BROKER_ID_NOT_REGISTERED."""
        raise NotImplementedError  # the brokers' reaction: FaultSim

    def _on_inspection(self, insp: Any) -> None:
        """A step asked a broker for its log of a partition (GetReplicaLogInfo)."""
        raise NotImplementedError  # the brokers' answer: FaultSim

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
        grace (a fresh `BrokerSessions`, as `ControllerService.activate`)."""
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
