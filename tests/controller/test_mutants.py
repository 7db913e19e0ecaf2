"""Behaviours that mutation testing of the pure core found unchecked (issue 30, "Tests
that would fail today but do not exist"). Each test names, in its docstring, the mutant
it kills: the file, the code and the change that makes it fail."""

from __future__ import annotations

from typing import ClassVar

import msgspec
import pytest

from controller.core import lifecycle
from controller.core.config import ControllerConfig
from controller.core.handler_result import ClearElrSlice
from controller.core.lifecycle import (
    Bootstrap,
    ElectPreferredGroup,
    add_up,
    bootstrap,
    clear_elr_slice,
    needs_bootstrap,
)
from controller.core.recovery.policy import (
    Choose,
    Decision,
    PendingRecovery,
    RecoveryPolicy,
    RestartWindow,
)
from controller.core.recovery.tracker import RecoveryTracker, manual_election
from controller.core.step import LogInfoAnswers, Rules, StepResult, Tick
from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from metadata_image.state import PartitionState
from metadata_log.records import (
    BROKER_RESOURCE,
    ELR_FEATURE,
    MIN_ISR_CONFIG,
    NO_LEADER,
    ChangeReason,
    ClearElrRecord,
    ConfigRecord,
    FeatureLevelRecord,
    MetadataRecord,
    PartitionChangeRecord,
    UncleanRecoveryRecord,
)
from protocol.messages.admin import (
    AlterConfigs,
    AlterConfigsResponse,
    AlterPartitionReassignments,
    AlterPartitionReassignmentsResponse,
    ElectionFailure,
    ElectLeader,
    ElectPreferredLeadersResponse,
    Reassignment,
    UpdateFeature,
    UpdateFeatureResponse,
)
from protocol.messages.internal import Ack, FenceBroker, ReplicaLogInfo

from .testkit import POLICIES, Cluster


def _audits(records: list[MetadataRecord]) -> list[UncleanRecoveryRecord]:
    return [r for r in records if isinstance(r, UncleanRecoveryRecord)]


def _budget(c: Cluster, budget: int | None) -> None:
    c.rules = Rules(c.config, c.policies, work_budget=budget)


# --- a recovery window of 0 ------------------------------------------------------------------


def test_a_proactive_window_of_0_restarts_with_its_deadline_exactly_now() -> None:
    """With `--unclean-recovery-window-ms 0` a proactive recovery with no usable answer
    restarts its window at `now`, ending at `now` too: the first answer is taken at once.

    Kills controller/core/recovery/tracker.py `_decide`, RestartWindow branch:
    `window = policy.window_ms(...) or 0` mutated to `or 1` (the restarted window would
    end at now + 1 and the answer would wait for a wake-up)."""
    c = Cluster(ControllerConfig(unclean_recovery_window_ms=0))
    c.start(1, 2, 3)
    c.create("t", replication_factor=3, min_isr=2, recovery_strategy="proactive")
    c.now = 100
    for b in (3, 2, 1):
        c.fence(b)
    assert c.view() == (NO_LEADER, [], [1, 2], [])
    # The recovery began at 100 with a window ending at 100; nobody answered, so the
    # window restarted at once: from 100 to 100, no wake-up needed.
    pr = c.tracker.pending[("t", 0)]
    assert (pr.started_ms, pr.deadline_ms) == (100, 100)
    assert c.last is not None and c.last.next_deadline_ms is None
    assert not c.tracker.wake_of
    c.now = 200
    c.register(3)  # unclean: out of sync, but a proactive candidate once active
    c.unfence(3)
    assert c.last is not None
    assert [i.broker_id for i in c.last.inspections] == [3]
    pr = c.tracker.pending[("t", 0)]
    assert (pr.started_ms, pr.deadline_ms) == (200, 200)
    c.answer(3, 0, 5)  # still at 200: the window has ended, 3 is chosen now
    assert c.last is not None
    (audit,) = _audits(c.last.records)
    assert (audit.chosen, audit.at_ms, audit.offline_since_ms) == (3, 200, 100)
    assert c.view() == (3, [3], [], [])
    assert not c.tracker.pending


class _RestartingPolicy:
    """A windowless policy (window_ms None) that restarts its window until a replica
    answers, then chooses it: the `or 0` covers a window of None too."""

    name: ClassVar[str] = "restarting"

    def trigger(self, image: ClusterImage, p: PartitionState) -> str | None:
        return None if p.has_leader else "leaderless"

    def candidates(self, image: ClusterImage, p: PartitionState) -> frozenset[int]:
        return frozenset(p.replicas)

    def window_ms(self, window_ms: int) -> int | None:
        return None

    def decide(
        self, image: ClusterImage, p: PartitionState, pending: PendingRecovery, now_ms: int
    ) -> Decision:
        answers = pending.valid_answers(image)
        return Choose(answers[0].broker_id) if answers else RestartWindow()


def test_a_windowless_policy_that_restarts_its_window_ends_it_now() -> None:
    """A policy without a window (window_ms None) that answers RestartWindow gets a
    window from now to now, not a crash and not a later deadline.

    Kills controller/core/recovery/tracker.py `_decide`: `or 0` mutated to `or 1` (the
    deadline would be now + 1) and `or 0` deleted (`now_ms + None` raises TypeError)."""
    policies: dict[str, RecoveryPolicy] = {**POLICIES, "restarting": _RestartingPolicy()}
    c = Cluster(policies=policies)
    c.start(1, 2)
    c.create("t", assignments=[[1, 2]], min_isr=1, recovery_strategy="restarting")
    c.now = 40
    c.fence(2)
    c.fence(1)
    assert c.view()[0] == NO_LEADER
    pr = c.tracker.pending[("t", 0)]
    assert (pr.strategy, pr.started_ms, pr.deadline_ms) == ("restarting", 40, 40)
    assert c.last is not None and c.last.next_deadline_ms is None


# --- manual elections and the offline notes ---------------------------------------------------


def _manual_outage() -> Cluster:
    """Topics t and u on [1, 2, 3] (MinISR 2, manual recovery), every broker fenced at 7,
    then broker 3 restarted uncleanly at 30: both leaderless and noted since 7."""
    c = Cluster()
    c.start(1, 2, 3)
    for name in ("t", "u"):
        c.create(name, replication_factor=3, min_isr=2, recovery_strategy="manual")
    c.now = 7
    for b in (3, 2, 1):
        c.fence(b)
    c.now = 30
    c.restart(3, clean=False)
    for name in ("t", "u"):
        assert c.view(name)[0] == NO_LEADER
        assert c.tracker.offline_since(c.p(name)) == 7
    return c


def test_a_manual_election_drops_the_partition_from_the_offline_notes() -> None:
    """An operator's unclean election gives the partition a leader: `manual_election`
    returns a tracker without its offline note (and with the other partitions' notes).

    Kills controller/core/recovery/tracker.py `manual_election`: the line
    `offline.pop(p.tp, None)  # it has a leader now` deleted."""
    c = _manual_outage()
    request = ElectLeader(topic="t", partition=0, election_type="unclean", replica=3)
    records, tracker = manual_election(c.image, c.tracker, request, c.now)
    audit, change = records
    assert isinstance(audit, UncleanRecoveryRecord) and audit.offline_since_ms == 7
    assert isinstance(change, PartitionChangeRecord) and change.leader == 3
    assert ("t", 0) in c.tracker.offline
    assert ("t", 0) not in tracker.offline
    assert ("u", 0) in tracker.offline  # still leaderless: its note stays
    assert tracker.offline_since(c.image.partitions[("u", 0)]) == 7


def test_a_manual_election_while_a_transaction_is_open_leaves_no_note_behind() -> None:
    """The same through the step while a transaction is open (`ControllerState.hold`):
    no evaluation runs to clean up after the election, so the state the step returns
    must already be without the note.

    Kills the same mutant (controller/core/recovery/tracker.py `manual_election`,
    `offline.pop(p.tp, None)` deleted)."""
    c = _manual_outage()
    c.state = msgspec.structs.replace(c.state, hold=True)
    result = c.step_one(ElectLeader(topic="t", partition=0, election_type="unclean", replica=3))
    assert result.recovery_records == 0  # nothing evaluated while held
    assert c.view() == (3, [3], [], [])
    assert ("t", 0) not in result.state.tracker.offline
    assert ("u", 0) in result.state.tracker.offline


# --- a partition made leaderless by something other than a broker change ----------------


def test_a_reassignment_that_moves_the_leader_off_is_evaluated_in_the_same_step() -> None:
    """t-0 is moved from [1, 2] to [3, 4]; 3 catches up and leads once 1 and 2 are
    fenced, while nothing is leaderless and the tracker knows nothing. A cancel would take
    3, the only ISR member, out of the assignment: it is refused (issue 30). A log written
    before that refusal holds such a cancel: replayed, it makes the partition leaderless
    (ISR and ELR empty) through a change that is not a broker change, and the next step
    must note it and start its (balanced) recovery.

    Kills controller/core/step.py `queue_touched`: `if offline or notes or pending or
    wakes:` mutated to `if notes or pending or wakes:`, and the filter `tp in offline or`
    deleted (the partition would not be queued: no note, no recovery, an idle
    controller)."""
    c = Cluster()
    c.start(1, 2, 3, 4)
    c.create("t", assignments=[[1, 2]], min_isr=1)
    c.submit(
        AlterPartitionReassignments(
            reassignments=[Reassignment(topic="t", partition=0, replicas=[3, 4])]
        )
    )
    assert (c.p().replicas, c.p().adding, c.p().removing) == ((3, 4, 1, 2), (3, 4), (1, 2))
    c.alter([1, 2, 3])  # 3 caught up; 4 not yet
    c.fence(1)
    c.fence(2)
    assert c.view() == (3, [3], [], [])
    assert not c.image.offline
    assert c.tracker == RecoveryTracker()  # nothing noted, pending or due
    assert c.state.idle
    cancel = AlterPartitionReassignments(
        reassignments=[Reassignment(topic="t", partition=0, replicas=None)]
    )
    refused = c.step_one(cancel)
    assert isinstance(refused.response, AlterPartitionReassignmentsResponse)
    assert [r.error_code for r in refused.response.results] == ["INVALID_REPLICA_ASSIGNMENT"]
    assert refused.records == []
    p = c.p()
    c.commit(
        [
            PartitionChangeRecord(
                topic="t",
                partition=0,
                reason=ChangeReason.REASSIGNMENT,
                partition_epoch=p.partition_epoch + 1,
                leader_epoch=p.leader_epoch + 1,
                leader=NO_LEADER,
                isr=[],
                replicas=[1, 2],
                adding_replicas=[],
                removing_replicas=[],
            )
        ]
    )
    assert c.view() == (NO_LEADER, [], [], [])
    assert ("t", 0) in c.image.offline
    c.now = 50
    c.step_one(Tick())
    assert c.tracker.offline_since(c.p()) == 50
    pr = c.tracker.pending[("t", 0)]
    assert (pr.strategy, pr.trigger, pr.since_ms) == ("balanced", "isr_and_elr_empty", 50)
    assert c.state.idle


# --- slices and the work budget -------------------------------------------------------------


def test_the_first_slice_of_a_sliced_fence_evaluates_no_recoveries() -> None:
    """A fence of a broker with 20 partitions and a budget of 7 opens a transaction; its
    first slice makes 7 partitions leaderless. While the transaction is open nothing is
    evaluated: no note, no pending recovery, no inspection; the partitions wait in the
    backlog and are evaluated after the end marker.

    Kills controller/core/step.py `_step`: `if follow_up is not None or inside or
    state.hold:` mutated to `if inside or state.hold:` (the slice that opens the
    transaction would evaluate recoveries over a half-applied fence)."""
    c = Cluster()
    c.start(1, 2)
    c.create("solo", assignments=[[1]] * 20, min_isr=1, recovery_strategy="proactive")
    _budget(c, 7)
    first = c.step_one(FenceBroker(broker_id=1))
    assert first.follow_up is not None
    leaderless = {tp for tp in first.delta.partitions if tp in first.state.image.offline}
    assert len(leaderless) == 7
    assert first.recovery_records == 0 and first.inspections == []
    assert first.state.tracker == RecoveryTracker()
    assert leaderless <= set(first.state.backlog)
    result: StepResult = first
    for _ in range(10):  # bounded: 20 partitions are 3 slices
        if result.follow_up is None:
            break
        result = c.step_one(result.follow_up)
    assert result.follow_up is None
    for _ in range(10):
        if c.state.idle:
            break
        c.step_one(Tick())
    assert c.state.idle
    assert len(c.image.offline) == 20
    assert set(c.tracker.pending) == set(c.image.offline)  # all evaluated after the end


def test_more_answers_than_the_budget_are_evaluated_a_budget_per_step() -> None:
    """20 balanced recoveries wait for broker 1's answers; one LogInfoAnswers brings all
    20. With a budget of 7 the step evaluates (and decides) 7, the Ticks after it 7 and
    6: the answers are queued in the backlog, not all looked at in one step.

    Kills controller/core/step.py `_step`: the line `tracker =
    msgspec.structs.replace(tracker, answered=frozenset())` deleted (`evaluate` would also
    look at every answered partition: 20 in one step), and `backlog.take(budget)`
    mutated to `backlog.take(None)`."""
    c = Cluster()
    c.start(1, 2)
    c.create("solo", assignments=[[1]] * 20, min_isr=1)
    c.fence(1)
    c.restart(1, clean=False)  # unclean: LastKnownELR [1] everywhere
    assert len(c.tracker.pending) == 20
    _budget(c, 7)
    answers = tuple(
        ReplicaLogInfo(
            broker_id=1,
            broker_epoch=c.epoch(1),
            topic="solo",
            partition=i,
            last_leader_epoch=1,
            log_end_offset=10,
        )
        for i in range(20)
    )
    first = c.step_one(LogInfoAnswers(answers))
    assert len(_audits(first.records)) == 7
    assert first.recovery_records == 14  # an audit and a change each
    assert len(c.tracker.pending) == 13
    assert not first.state.idle
    # The answers of the partitions not yet looked at are kept.
    assert all(1 in pr.answers for pr in c.tracker.pending.values())
    counts = []
    for _ in range(10):  # bounded: two more budgets
        if c.state.idle:
            break
        counts.append(len(_audits(c.step_one(Tick()).records)))
    assert counts == [7, 6]
    assert not c.tracker.pending and not c.image.offline


# --- bootstrap and the feature level ----------------------------------------------------------

_FEATURE = FeatureLevelRecord(name=ELR_FEATURE, level=1)


def _cluster_min_isr(value: str) -> ConfigRecord:
    return ConfigRecord(
        resource_type=BROKER_RESOURCE, resource_name="", name=MIN_ISR_CONFIG, value=value
    )


_MIN_ISR = _cluster_min_isr("2")


@pytest.mark.parametrize(
    ("present", "missing"),
    [
        ([_FEATURE], _cluster_min_isr("3")),
        ([_MIN_ISR], FeatureLevelRecord(name=ELR_FEATURE, level=1)),
        (
            [FeatureLevelRecord(name=ELR_FEATURE, level=0)],
            _cluster_min_isr("3"),
        ),
    ],
    ids=["feature-only", "min-isr-only", "feature-0-only"],
)
def test_bootstrap_with_one_record_writes_only_the_missing_one(
    present: list[MetadataRecord], missing: MetadataRecord
) -> None:
    """A log that holds the ELR feature level but no cluster MinISR (or the reverse)
    still needs bootstrapping, and the bootstrap writes the missing record only: the
    record present (say a level the operator lowered to 0) is never overwritten.

    Kills controller/core/lifecycle.py `needs_bootstrap`: `... or MIN_ISR_CONFIG not in
    ...` mutated to `and`; and `bootstrap`: either `if ... not in ...:` guard mutated to
    `if True:` (or deleted), which writes a record already present."""
    config = ControllerConfig(default_min_insync_replicas=3)
    image = replay(ClusterImage(), present)
    assert needs_bootstrap(image)
    result = bootstrap(image, config)
    assert result.records == [missing]
    assert result.response == Ack()
    done = replay(image, result.records)
    assert not needs_bootstrap(done)
    assert bootstrap(done, config).records == []
    # Through the step, as the service submits it.
    c = Cluster(config)
    c.commit(present)
    assert c.submit(Bootstrap()).records == [missing]
    assert not needs_bootstrap(c.image)


def test_bootstrap_of_an_empty_log_writes_both_and_a_bootstrapped_one_nothing() -> None:
    """The two ends of the same rule (so that the test above is not passed by a bootstrap
    that always writes one record).

    Kills controller/core/lifecycle.py `needs_bootstrap`: `or` mutated to `and` (an
    empty log would need nothing), and `not in` mutated to `in`."""
    config = ControllerConfig(eligible_leader_replicas=False, default_min_insync_replicas=2)
    empty = ClusterImage()
    assert needs_bootstrap(empty)
    records = bootstrap(empty, config).records
    assert records == [FeatureLevelRecord(name=ELR_FEATURE, level=0), _MIN_ISR]
    assert not needs_bootstrap(replay(empty, records))


@pytest.mark.parametrize("elr", [True, False], ids=["elr-default", "classic-default"])
def test_an_upgrade_on_an_unbootstrapped_cluster_writes_only_the_feature_level(
    elr: bool,
) -> None:
    """On a log with no finalized feature level (its rules come from the controller's
    static setting), an upgrade to level 1 writes the FeatureLevelRecord and nothing
    else: an upgrade clears no ELR, even where the static setting already had ELR on.

    Kills controller/core/lifecycle.py `update_feature`: `if req.level >= 1 or current ==
    0:` mutated to `and` (the ELR default would take the downgrade path and write a
    ClearElrRecord per topic); and `if finalized == req.level:` mutated to `current ==
    req.level` (the ELR default would write nothing, leaving the level unpinned)."""
    c = Cluster(ControllerConfig(eligible_leader_replicas=elr))
    c.start(1, 2, 3)
    c.create("a", assignments=[[1, 2, 3]], min_isr=2)
    c.create("b", assignments=[[2, 3], [3, 1]], min_isr=2)
    assert ELR_FEATURE not in c.image.features
    result = c.submit(UpdateFeature(name=ELR_FEATURE, level=1))
    assert result.records == [FeatureLevelRecord(name=ELR_FEATURE, level=1)]
    assert result.response == UpdateFeatureResponse(name=ELR_FEATURE, level=1)
    assert c.image.features[ELR_FEATURE] == 1


def test_a_downgrade_to_0_on_an_unbootstrapped_classic_cluster_writes_only_the_level() -> None:
    """The other half of `req.level >= 1 or current == 0`: with the static setting
    classic (level 0 in effect), pinning level 0 clears nothing (there is no ELR).

    Kills controller/core/lifecycle.py `update_feature`: `or` mutated to `and`."""
    c = Cluster(ControllerConfig(eligible_leader_replicas=False))
    c.start(1, 2)
    c.create("a", assignments=[[1, 2]], min_isr=1)
    result = c.submit(UpdateFeature(name=ELR_FEATURE, level=0, upgrade_type="downgrade"))
    assert result.records == [FeatureLevelRecord(name=ELR_FEATURE, level=0)]
    assert result.response == UpdateFeatureResponse(name=ELR_FEATURE, level=0)


# --- clearing ELRs without a budget ------------------------------------------------------------


class _Bounded:
    """A stand-in for ClearElrRecord that fails after `limit` records: a mutant that
    loops inside `clear_elr_slice` stops here (deterministically) instead of running
    until memory runs out."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.made = 0

    def __call__(self, **fields: object) -> ClearElrRecord:
        self.made += 1
        if self.made > self.limit:
            raise AssertionError(f"more than {self.limit} ClearElrRecords: a loop")
        return ClearElrRecord(**fields)  # type: ignore[arg-type]


def _clear(record: MetadataRecord) -> tuple[str, int | None, int, int | None]:
    """A ClearElrRecord's range and MinISR (its record version is another matter)."""
    assert isinstance(record, ClearElrRecord)
    return record.topic, record.min_isr, record.first, record.end


def test_clearing_without_a_budget_writes_every_topic_and_no_follow_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`clear_elr_slice` with no budget (None) writes one whole-topic ClearElrRecord per
    topic and returns the response, with no continuation.

    Kills controller/core/lifecycle.py `clear_elr_slice`: `else 1 << 62` mutated to
    `else 0` (no record and a continuation that is the same slice: `settle` steps it
    forever), and `if end >= partitions:` mutated to `>` (the loop stays on the first
    topic, writing empty ranges 2**62 times; stopped by `_Bounded`)."""
    monkeypatch.setattr(lifecycle, "ClearElrRecord", _Bounded(100))
    response = AlterConfigsResponse(resource_type="broker", resource_name="", cleared_topics=3)
    s = ClearElrSlice((("a", 3, 2), ("b", 1, None), ("c", 5, 1)), 0, response)
    result = clear_elr_slice(s, None)
    assert result.follow_up is None
    assert result.response is response
    assert all(isinstance(r, ClearElrRecord) for r in result.records)
    assert [_clear(r) for r in result.records] == [
        ("a", 2, 0, None),
        ("b", None, 0, None),
        ("c", 1, 0, None),
    ]


def test_a_cluster_min_isr_change_without_a_budget_is_one_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same through the step, with `Rules.work_budget=None`: a cluster-default
    min.insync.replicas change is one step (no transaction, no follow-up) with the
    ConfigRecord and one ClearElrRecord per topic. The follow-ups are stepped by a
    bounded loop, so that a mutant which never ends its clearing fails here.

    Kills the same mutants as the test above (controller/core/lifecycle.py
    `clear_elr_slice`, `else 1 << 62` -> `else 0`; `end >= partitions` -> `>`)."""
    monkeypatch.setattr(lifecycle, "ClearElrRecord", _Bounded(100))
    c = Cluster()
    c.start(1, 2, 3)
    c.create("a", assignments=[[1, 2, 3]] * 4, min_isr=2)
    c.create("b", assignments=[[2, 3]], min_isr=None)
    c.create("c", assignments=[[3, 1]] * 2, min_isr=1)
    _budget(c, None)
    request = AlterConfigs(
        resource_type=BROKER_RESOURCE, resource_name="", set_configs={MIN_ISR_CONFIG: "2"}
    )
    result = c.step_one(request)
    steps = 1
    while result.follow_up is not None and steps < 20:
        result = c.step_one(result.follow_up)
        steps += 1
    assert steps == 1 and result.follow_up is None
    assert result.response == AlterConfigsResponse(
        resource_type=BROKER_RESOURCE, resource_name="", cleared_topics=3
    )
    config, *clears = result.records
    assert config == _cluster_min_isr("2")
    assert [_clear(r) for r in clears] == [("a", 2, 0, None), ("b", 2, 0, None), ("c", 1, 0, None)]
    assert c.image.cluster_configs[MIN_ISR_CONFIG] == "2"


# --- a reassignment to the full replica list of one in progress -------------------------------


def test_a_new_target_equal_to_the_full_replica_list_keeps_every_replica() -> None:
    """t-0 is moving from [1, 2] to [2, 3]: replicas [2, 3, 1], adding [3], removing
    [1]. A new reassignment whose target is that full list [2, 3, 1] replaces the one in
    progress (KIP-455: a new target replaces the old, computed from the original
    replicas): nothing is removed any more, 3 is still being added, and once 3 is in sync
    the partition completes with all three replicas. It is not "already so, nothing to
    do": that would keep removing 1, against the request.

    (Kafka's KRaft controller computes the change from the full current replicas and
    leaves the old adding/removing in place when both come out empty, so there a request
    of the full list is silently ignored and replica 1 is still dropped; metactl follows
    KIP-455 and the request's target.)

    Kills controller/core/lifecycle.py `reassign`: `if target == p.replicas and not
    p.reassigning: return []` mutated to `if target == p.replicas: return []`."""
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2]], min_isr=1)

    def reassign(replicas: list[int]) -> list[str | None]:
        r = c.submit(
            AlterPartitionReassignments(
                reassignments=[Reassignment(topic="t", partition=0, replicas=replicas)]
            )
        )
        assert isinstance(r.response, AlterPartitionReassignmentsResponse)
        return [x.error_code for x in r.response.results]

    assert reassign([2, 3]) == [None]
    p = c.p()
    assert (p.replicas, p.adding, p.removing, p.target) == ((2, 3, 1), (3,), (1,), (2, 3))
    before = len(c.log)
    assert reassign([2, 3, 1]) == [None]
    assert len(c.log) == before + 1  # a record: the reassignment changed
    p = c.p()
    assert (p.replicas, p.adding, p.removing) == ((2, 3, 1), (3,), ())
    assert p.target == (2, 3, 1) and p.original == (2, 1) and p.reassigning
    assert ("t", 0) in c.image.reassigning
    assert c.view() == (1, [1, 2], [], [])  # leadership and ISR untouched
    c.alter([1, 2, 3])  # 3 caught up: the reassignment completes
    p = c.p()
    assert (p.replicas, p.adding, p.removing) == ((2, 3, 1), (), ())
    assert p.isr == {1, 2, 3} and not p.reassigning
    assert ("t", 0) in c.image.replicas_by_broker[1]


# --- a combined preferred election answer ------------------------------------------------------


def test_the_counts_of_a_combined_election_answer_add_up() -> None:
    """`add_up` sums each count of two pieces (not twice one of them) and keeps the
    failures in order; the answer of a bulk election cut into pieces equals the answer
    of the same election in one piece, and its counts add up to the partitions named.

    Kills controller/core/lifecycle.py `add_up`: any count computed from one side only
    (e.g. `not_needed=total.not_needed + total.not_needed`, `not_available=
    piece.not_available`, `unknown=total.unknown`), the failures of one side dropped or
    reordered; and in `elect_preferred_group`, any of `elected += 1`, `not_needed += 1`,
    `not_available += 1`, `unknown += 1` deleted."""
    f1 = ElectionFailure(topic="a", partition=1, error_code="PREFERRED_LEADER_NOT_AVAILABLE")
    f2 = ElectionFailure(topic="b", partition=2, error_code="UNKNOWN_TOPIC_OR_PARTITION")
    one = ElectPreferredLeadersResponse(
        elected=1, not_needed=2, not_available=3, unknown=4, failures=[f1]
    )
    two = ElectPreferredLeadersResponse(
        elected=10, not_needed=20, not_available=30, unknown=40, failures=[f2]
    )
    assert add_up(one, two) == ElectPreferredLeadersResponse(
        elected=11, not_needed=22, not_available=33, unknown=44, failures=[f1, f2]
    )
    assert add_up(ElectPreferredLeadersResponse(), two) == two

    def cluster() -> Cluster:
        c = Cluster()
        c.start(1, 2, 3)
        c.create("t", assignments=[[1, 2], [2, 1], [3, 1], [1, 3], [2, 3], [1, 2]], min_isr=1)
        c.fence(1)  # t-0, t-3 and t-5 move off 1
        c.restart(1, clean=True)
        c.alter([1, 2], partition=0)  # back in t-0's and t-5's ISR only
        c.alter([1, 2], partition=5)
        return c

    groups = (("t", (0, 1, 2, 3, 4, 5, 9)), ("nope", (0, 1)))
    whole = cluster().submit(ElectPreferredGroup(groups)).response
    assert isinstance(whole, ElectPreferredLeadersResponse)
    assert (whole.elected, whole.not_needed, whole.not_available, whole.unknown) == (2, 3, 1, 3)
    named = sum(len(numbers) for _, numbers in groups)
    assert whole.elected + whole.not_needed + whole.not_available + whole.unknown == named
    assert len(whole.failures) == whole.not_available + whole.unknown
    # The same election in pieces of at most 3 partitions, as the service cuts it.
    c = cluster()
    pieces = [(("t", (0, 1, 2)),), (("t", (3, 4, 5)),), (("t", (9,)), ("nope", (0, 1)))]
    total = ElectPreferredLeadersResponse()
    for piece in pieces:
        answer = c.submit(ElectPreferredGroup(piece)).response
        assert isinstance(answer, ElectPreferredLeadersResponse)
        total = add_up(total, answer)
    assert total == whole
    assert [c.p("t", i).leader for i in range(6)] == [1, 2, 3, 3, 2, 1]
