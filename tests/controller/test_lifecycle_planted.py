"""The state machine of `test_properties.py` catches a planted bug in each lifecycle rule.

Each test replaces one piece of the core with a subtly wrong version (`monkeypatch`, so it
is restored afterwards) and runs `ControllerMachine` with a fixed seed (`derandomize`) and
a bounded number of examples, without shrinking: Hypothesis must find a failing example.
A checker that never fails proves nothing; these show that the model, its invariants and
the expected error codes each see the rule they are meant to see.

The planted bugs, one or more per rule of issue 19:

* configs: a topic's min.insync.replicas change that does not refresh the MinISR; a
  cluster-default change that clears only the topics without their own value, or
  nothing when the value is unchanged;
* features: a downgrade that clears no ELR;
* delete: pending recoveries of a deleted topic that stay; a re-created topic that gets
  its old id back;
* add partitions: new partitions placed as if they were the first ones; a count equal to
  the current one accepted;
* reassignment: a completion that leaves the removed replicas in the ISR, or leadership on
  a removed replica; a cancel that keeps the adding replicas in the ISR; a recovery that
  may choose a replica the reassignment is adding;
* unregister: a broker left in the LastKnownELRs it was in.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import RULE_MARKER, initialize, run_state_machine_as_test

from controller.core import broker_handlers, lifecycle, partition_change, step, topic_handlers
from controller.core.handler_result import HandlerResult
from controller.core.recovery import builtin
from controller.core.recovery.policy import Choose, RestartWindow, Wait, best_candidate
from controller.core.step import StepResult
from metadata_image.image import ClusterImage
from metadata_image.state import PartitionState
from metadata_log.records import (
    MIN_ISR_CONFIG,
    NO_LEADER,
    ClearElrRecord,
    PartitionChangeRecord,
    UncleanRecoveryRecord,
)
from protocol.messages.internal import CreateTopicResponse

from .test_properties import ControllerMachine, MPending, SlicedMachine


def _plain(rule: Callable[..., Any]) -> Callable[..., Any]:
    """A rule's function as a plain method (no rule marker)."""

    def method(self: Any, *a: Any, **k: Any) -> Any:
        return rule(self, *a, **k)

    return method


def focused(machine: type[ControllerMachine], *keep: str) -> type[ControllerMachine]:
    """`machine` with only the rules named in `keep` (and its set-up): the others stay
    callable (a rule may use another) but are no longer drawn, so that a planted bug's rule
    comes up often within a few examples."""
    hidden: dict[str, Any] = {}
    for name, member in inspect.getmembers(machine):
        if getattr(member, RULE_MARKER, None) is not None and name not in keep:
            hidden[name] = _plain(member)
    assert set(keep) <= {n for n, m in inspect.getmembers(machine) if hasattr(m, RULE_MARKER)}
    return type(f"Focused{machine.__name__}", (machine,), hidden)


SETTINGS = settings(
    max_examples=60,
    stateful_step_count=40,
    derandomize=True,
    database=None,
    deadline=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=list(HealthCheck),
    print_blob=False,
)


def caught(machine: type[ControllerMachine], *, where: str | None = None) -> None:
    """The machine finds a failure (seeded, at most `SETTINGS.max_examples` examples, not
    shrunk); with `where`, in that check."""
    with pytest.raises(AssertionError) as info:
        run_state_machine_as_test(machine, settings=SETTINGS)
    if where is not None:
        assert where in {entry.name for entry in info.traceback}, info.traceback


def wrap(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, bug: Callable[..., Any]) -> None:
    """Replace `module.name` by `bug(original, *args, **kwargs)`."""
    original = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: bug(original, *a, **k))


def without(result: HandlerResult, drop: Callable[[Any], bool]) -> HandlerResult:
    return msgspec.structs.replace(result, records=[r for r in result.records if not drop(r)])


# --- configs --------------------------------------------------------------------------


def test_a_topic_config_change_that_keeps_the_old_min_isr_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The topic's ClearElrRecords clear the ELRs but carry no new MinISR."""

    def bug(original: Any, image: ClusterImage, req: Any, *rest: Any) -> HandlerResult:
        result: HandlerResult = original(image, req, *rest)
        if req.resource_type != "topic":
            return result
        records = [
            msgspec.structs.replace(r, min_isr=None) if isinstance(r, ClearElrRecord) else r
            for r in result.records
        ]
        return msgspec.structs.replace(result, records=records)

    wrap(monkeypatch, lifecycle, "alter_configs", bug)
    caught(focused(ControllerMachine, "alter_configs", "fence", "restart", "isr_change"))


def test_a_cluster_default_that_skips_topics_with_their_own_value_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cluster-default change clears only the topics that follow the default (those
    with their own value keep their ELRs: the rule says every topic's)."""

    def bug(original: Any, image: ClusterImage, req: Any, *rest: Any) -> HandlerResult:
        result: HandlerResult = original(image, req, *rest)
        if req.resource_type != "broker":
            return result
        own = {t.name for t in image.topics.values() if t.min_isr is not None}
        return without(result, lambda r: isinstance(r, ClearElrRecord) and r.topic in own)

    wrap(monkeypatch, lifecycle, "alter_configs", bug)
    caught(focused(ControllerMachine, "alter_configs", "fence", "restart", "outage"))


def test_a_cluster_default_set_to_the_same_value_that_clears_nothing_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """KIP-966: a cluster-default update clears every topic's ELR even to the same value."""

    def bug(original: Any, image: ClusterImage, req: Any, *rest: Any) -> HandlerResult:
        result: HandlerResult = original(image, req, *rest)
        value = req.set_configs.get(MIN_ISR_CONFIG, "").strip()
        if req.resource_type == "broker" and image.cluster_configs.get(MIN_ISR_CONFIG) == value:
            return without(result, lambda r: isinstance(r, ClearElrRecord))
        return result

    wrap(monkeypatch, lifecycle, "alter_configs", bug)
    caught(focused(ControllerMachine, "reapply_cluster_default", "bootstrap", "fence", "outage"))


# --- features -------------------------------------------------------------------------


def test_a_downgrade_that_keeps_the_elrs_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def bug(original: Any, *args: Any) -> HandlerResult:
        return without(original(*args), lambda r: isinstance(r, ClearElrRecord))

    wrap(monkeypatch, lifecycle, "update_feature", bug)
    caught(focused(ControllerMachine, "update_feature", "fence", "restart", "outage"))


# --- delete ---------------------------------------------------------------------------


def test_pending_recoveries_that_outlive_their_topic_are_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The step forgets to look at a deleted topic's recoveries (they stay pending)."""

    def bug(original: Any, backlog: Any, image: Any, delta: Any, *rest: Any, **kw: Any) -> Any:
        delta.removed_topics = {}
        return original(backlog, image, delta, *rest, **kw)

    wrap(monkeypatch, step, "queue_touched", bug)
    caught(focused(ControllerMachine, "delete_topic", "fence", "restart", "outage", "tick"))


def test_a_recreated_topic_with_its_old_id_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A derived topic id that depends on the name only: re-created, it is the old one."""
    uuid5 = uuid.uuid5
    monkeypatch.setattr(uuid, "uuid5", lambda ns, name: uuid5(ns, name.split("@")[0]))
    caught(focused(ControllerMachine, "recreate", "create"))


# --- add partitions ------------------------------------------------------------------


def test_new_partitions_placed_as_the_first_ones_are_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Striping restarts at partition 0 instead of continuing at the new partition."""

    def bug(original: Any, order: Any, start: int, end: int, rf: int) -> Any:
        return original(order, 0, end - start, rf)

    wrap(monkeypatch, topic_handlers, "_striped", bug)
    caught(focused(ControllerMachine, "create_partitions", "restart"))


def test_an_unchanged_partition_count_accepted_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def bug(original: Any, image: ClusterImage, req: Any, *rest: Any) -> HandlerResult:
        t = image.topics.get(req.topic)
        if t is not None and req.count == t.partitions:
            response = CreateTopicResponse(name=t.name, topic_id=t.topic_id, assignments=[])
            return HandlerResult([], response)
        result: HandlerResult = original(image, req, *rest)
        return result

    wrap(monkeypatch, lifecycle, "create_partitions", bug)
    caught(focused(ControllerMachine, "create_partitions", "restart"))


# --- reassignment -------------------------------------------------------------------------


def completion(
    monkeypatch: pytest.MonkeyPatch,
    bug: Callable[[PartitionState, PartitionChangeRecord, set[int]], PartitionChangeRecord],
) -> None:
    """Plant `bug` in every completion of a reassignment that removes replicas (at the
    request, when the target is already in the ISR, or by an AlterPartition)."""

    def planted(original: Any, image: ClusterImage, p: PartitionState, *a: Any, **k: Any) -> Any:
        change = original(image, p, *a, **k)
        replicas, _, removing = a
        target = [r for r in replicas if r not in removing]
        if change is None or not removing or change.replicas != target:
            return change
        return bug(p, change, set(removing))

    wrap(monkeypatch, partition_change, "move_replicas", planted)
    wrap(monkeypatch, lifecycle, "move_replicas", planted)


def test_a_completion_that_keeps_removed_replicas_in_the_isr_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def bug(
        p: PartitionState, change: PartitionChangeRecord, gone: set[int]
    ) -> PartitionChangeRecord:
        isr = set(p.isr if change.isr is None else change.isr) | (p.isr & gone)
        return msgspec.structs.replace(change, isr=None if isr == p.isr else sorted(isr))

    completion(monkeypatch, bug)
    caught(focused(ControllerMachine, "reassign", "catch_up", "retire", "isr_change"))


def test_a_completion_that_leaves_leadership_on_a_removed_replica_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def bug(
        p: PartitionState, change: PartitionChangeRecord, gone: set[int]
    ) -> PartitionChangeRecord:
        if p.leader not in gone or change.leader is None:
            return change
        isr = set(p.isr if change.isr is None else change.isr) | {p.leader}
        return msgspec.structs.replace(
            change,
            leader=None,
            election=None,
            leader_epoch=p.leader_epoch,
            isr=None if isr == p.isr else sorted(isr),
        )

    completion(monkeypatch, bug)
    caught(focused(ControllerMachine, "reassign", "catch_up", "retire"))


class FiveBrokers(ControllerMachine):
    """The machine on five brokers from the start (spare brokers to move replicas to)."""

    @initialize()
    def start_cluster(self) -> None:
        ControllerMachine.start_cluster(self, n=5)


def test_a_cancel_that_keeps_the_adding_replicas_in_the_isr_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def bug(
        original: Any, image: ClusterImage, p: PartitionState, replicas: Any, *a: Any, **k: Any
    ) -> Any:
        change = original(image, p, replicas, *a, **k)
        cancel = p.adding and tuple(replicas) == p.original
        if change is not None and cancel and change.isr is not None:
            return msgspec.structs.replace(change, isr=None)
        return change

    wrap(monkeypatch, lifecycle, "move_replicas", bug)
    caught(focused(FiveBrokers, "reassign", "catch_up", "cancel", "fence", "unfence"))


class TrustingMachine(ControllerMachine):
    """The machine with its model following the core's recovery decisions instead of
    predicting them (and its pending recoveries copied from the tracker): only the
    invariants judge the recoveries."""

    def evaluate(self, result: StepResult) -> None:
        m = self.model
        for p in m.parts.values():
            if p.leader == NO_LEADER:
                m.offline_since.setdefault(p.tp, self.now)
            else:
                m.offline_since.pop(p.tp, None)
        records = result.records[len(result.records) - result.recovery_records :]
        for audit in records[::2]:
            assert isinstance(audit, UncleanRecoveryRecord)
            m.recover(m.parts[(audit.topic, audit.partition)], audit.chosen)
        m.pending = {
            tp: MPending(
                since=pr.since_ms,
                window_start=pr.started_ms,
                answers=dict(pr.answers),
                asked=dict(pr.requested),
            )
            for tp, pr in self.tracker.pending.items()
        }


def plant_adding_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proactive policy forgets that a replica a reassignment is adding is not a
    candidate (it has not copied the acknowledged records)."""

    def candidates(self: Any, image: ClusterImage, p: PartitionState) -> frozenset[int]:
        return frozenset(p.replicas)

    def decide(self: Any, image: ClusterImage, p: PartitionState, pending: Any, now_ms: int) -> Any:
        if pending.deadline_ms is not None and now_ms < pending.deadline_ms:
            return Wait(pending.deadline_ms)
        answers = [a for a in pending.valid_answers(image) if image.is_active(a.broker_id)]
        best = best_candidate(p, [a for a in answers if a.broker_id in p.replicas])
        return RestartWindow() if best is None else Choose(best.broker_id)

    monkeypatch.setattr(builtin.ProactivePolicy, "candidates", candidates)
    monkeypatch.setattr(builtin.ProactivePolicy, "decide", decide)


def test_a_recovery_that_may_choose_a_replica_being_added_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plant_adding_candidates(monkeypatch)
    caught(focused(ControllerMachine, "reassign", "retire", "outage", "answer_every_inspection"))


@pytest.mark.parametrize("planted", [False, True])
def test_the_silent_loss_invariant_alone_sees_an_adding_replica_elected(
    monkeypatch: pytest.MonkeyPatch, planted: bool
) -> None:
    """With the model trusting the core's recoveries, `adding_replicas_are_never_silently_
    elected` alone judges them: a partition moving to [4, 2, 3] loses every broker; all
    come back uncleanly and report the same log; at the window's end the proactive
    recovery chooses the first replica in assignment order that is a candidate: 2 (the
    invariant holds), or with the planted bug 4, which was only being added."""
    if planted:
        plant_adding_candidates(monkeypatch)
    m = TrustingMachine()
    m.start_cluster(n=4)
    m.reassign([(sorted(m.model.parts).index(("pro", 0)), [4, 2, 3], False)])
    m.outage(fence_order=[1, 2, 3, 4, 5], restart_order=[1, 2, 3, 4, 5], clean=[False] * 5)
    m.answer_every_inspection(logs=[(0, 0)] * 6)
    m.tick(1000)
    p = m.image.partitions[("pro", 0)]
    assert p.adding == (4,) and p.recovery_state.value
    assert p.leader == (4 if planted else 2)
    if planted:
        with pytest.raises(AssertionError):
            m.adding_replicas_are_never_silently_elected()
    else:
        m.adding_replicas_are_never_silently_elected()


# --- unregister ----------------------------------------------------------------------------


def test_an_unregistered_broker_left_in_the_last_known_elr_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The partitions where the broker is only in the LastKnownELR are skipped."""

    def bug(original: Any, image: ClusterImage, broker_id: int, partitions: Any, **k: Any) -> Any:
        named = [p for p in partitions if broker_id in p.isr or broker_id in p.elr]
        return original(image, broker_id, named, **k)

    wrap(monkeypatch, broker_handlers, "without_broker", bug)
    caught(focused(ControllerMachine, "unregister", "fence", "restart", "outage", "retire"))


def test_the_sliced_machine_reaches_every_lifecycle_continuation() -> None:
    """With a work budget of one partition, the clearing of a min.insync.replicas change
    or an ELR downgrade (ClearElrSlice), a reassignment of several partitions
    (ReassignSlice) and an unregistration (Continue(UNREGISTER)) each run as a
    transaction of several slices in the sliced machine."""
    SlicedMachine.SLICED.clear()
    machine = focused(
        SlicedMachine, "alter_configs", "update_feature", "reassign", "retire", "outage"
    )
    run_state_machine_as_test(machine, settings=settings(SETTINGS, max_examples=20))
    seen = SlicedMachine.SLICED
    for kind in (
        "AlterConfigs",
        "UpdateFeature",
        "AlterPartitionReassignments",
        "UnregisterBroker",
    ):
        assert seen[kind] > 0, (kind, dict(seen))
