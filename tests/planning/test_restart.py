"""`planning.plan_restart` against answers worked out by hand from KIP-966's rules
(/work/shared/reference/kip-966-last-replica-standing.md: rule 1 and cases A-G) and the
controller's own (controller/core: rules 2-5 in broker_handlers.py, rule 1 and the clean
election order in partition_change.py, the policies in recovery/builtin.py).

Each test builds a cluster through the core's step (tests/controller/testkit.py), asks
for the plan of one broker's restart, and compares every list of both cases with the
answer its docstring derives. The plan must not change the image it was given.
"""

from __future__ import annotations

import pytest

from controller.core.config import ControllerConfig
from metactl.errors import BrokerIdNotRegisteredError, InvalidRequestError
from planning.restart import plan_restart
from protocol.messages.plan import PlannedPartition, PlanRestartResponse, RecoveryNeed, RestartCase
from tests.controller.testkit import Cluster

NOW = 1_000_000


def plan(c: Cluster, broker: int, limit: int | None = None) -> PlanRestartResponse:
    before = c.image
    r = plan_restart(c.image, broker, rules=c.rules, now_ms=NOW, limit=limit)
    assert c.image is before and c.image.same_state(before)  # a copy was stepped
    return r


Row = tuple[str, int, int, list[int], list[int], list[int]]


def rows(case: RestartCase, field: str) -> list[Row]:
    """(partition, leader before, leader after, ISR, ELR, LastKnownELR) of a list."""
    listed = getattr(case, field)
    assert listed.count == len(listed.partitions)
    return [
        (f"{p.topic}-{p.partition}", p.leader_before, p.leader, p.isr, p.elr, p.last_known_elr)
        for p in listed.partitions
    ]


def only(case: RestartCase, field: str) -> PlannedPartition:
    (p,) = getattr(case, field).partitions
    return p


def empty(case: RestartCase, *fields: str) -> bool:
    return all(getattr(case, f).count == 0 for f in fields)


ALL = ("under_min_isr", "leader_lost", "elected_from_elr", "unclean_recovery")


def started(min_isr: int = 2, strategy: str | None = None) -> Cluster:
    """Brokers 1-3 active; topic t: one partition, replicas [1,2,3], ISR [1,2,3], leader 1."""
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2, 3]], min_isr=min_isr, recovery_strategy=strategy)
    assert c.view() == (1, [1, 2, 3], [], [])
    return c


def test_a_healthy_partition_survives_either_restart_of_its_leader() -> None:
    """ISR [1,2,3], MinISR 2, leader 1; restart 1.

    Clean: the controlled shutdown takes 1 out of the ISR: [2,3], still at MinISR, so the
    ELR stays empty (case F) and the first active ISR member in replica order, 2, leads
    (an ISR election, not the ELR's). Its clean registration and unfence change nothing
    (rule 4 elects only where there is no leader). Unclean: the fence does the same (case
    D); its unclean registration finds it in no ELR. Every list is empty in both cases."""
    c = started()
    r = plan(c, 1)
    assert (r.broker_id, r.replicas, r.leads, r.end_offset) == (1, 1, 1, c.image.end_offset)
    assert empty(r.clean, *ALL) and empty(r.unclean, *ALL)
    assert r.clean.kind == "clean" and r.unclean.kind == "unclean"
    assert r.clean.steps[0] == "controlled shutdown of broker 1"
    assert r.unclean.steps[0] == "fence of broker 1 (its session timed out)"


def test_isr_at_min_isr_follower_restart_goes_under_min_isr_and_into_the_elr() -> None:
    """ISR [1,2] (3 lags, out of it), MinISR 2, leader 1; restart follower 2.

    Either way 2 leaves the ISR: [1] is below MinISR, so by rule 1 (case A) 2 joins the
    ELR: ELR [2]; leader 1 stays. Under MinISR: t-0 (ISR 1 < 2); no leader lost; no ELR
    election. Clean: its clean registration keeps it in the ELR, and its unfence elects
    nothing (t-0 has a leader). Unclean: its unclean registration moves it to the
    LastKnownELR (Unclean Exclusion) — but 1 still leads, so no recovery is needed."""
    c = started()
    c.alter([1, 2])
    assert c.view() == (1, [1, 2], [], [])
    r = plan(c, 2)
    for case in (r.clean, r.unclean):
        assert rows(case, "under_min_isr") == [("t-0", 1, 1, [1], [2], [])]
        assert empty(case, "leader_lost", "elected_from_elr", "unclean_recovery")
    assert r.leads == 0


def test_isr_at_min_isr_leader_restart_moves_leadership_and_keeps_it_in_the_elr() -> None:
    """ISR [1,2], MinISR 2, leader 1; restart leader 1.

    1 leaves the ISR: [2] < MinISR, so 1 joins the ELR (case C) and 2, the first active
    ISR member, leads (an ISR election). Under MinISR: t-0, leader 1 -> 2, ISR [2], ELR
    [1]. No leader lost, nothing from the ELR, no recovery, clean or unclean."""
    c = started()
    c.alter([1, 2])
    r = plan(c, 1)
    for case in (r.clean, r.unclean):
        assert rows(case, "under_min_isr") == [("t-0", 1, 2, [2], [1], [])]
        assert empty(case, "leader_lost", "elected_from_elr", "unclean_recovery")


def test_last_isr_member_with_an_active_elr_member_hands_over_to_the_elr() -> None:
    """ISR [1], ELR [2] with 2 active (it was fenced out of ISR [1,2], then came back
    cleanly: rule 4 elects nobody while 1 leads), MinISR 2; restart leader 1.

    1 leaves the ISR: it empties. Rule 1: 0 < MinISR, so the ELR is [1,2]; the ISR is
    empty, so the first active ELR member in replica order leads (case B): 2, elected
    from the ELR, which moves it to the ISR: ISR [2], ELR [1]. Under MinISR (1 < 2);
    leader not lost; elected from the ELR while 1 is down. Clean: 1 stays in the ELR.
    Unclean: its unclean registration moves it to the LastKnownELR: ELR [], LKELR [1];
    2 leads, so no recovery."""
    c = started()
    c.alter([1, 2])
    c.fence(2)
    c.restart(2, clean=True)
    assert c.view() == (1, [1], [2], [])
    r = plan(c, 1)
    for case in (r.clean, r.unclean):
        assert rows(case, "under_min_isr") == [("t-0", 1, 2, [2], [1], [])]
        assert rows(case, "elected_from_elr") == [("t-0", 1, 2, [2], [1], [])]
        p = only(case, "elected_from_elr")
        assert (p.election, p.on_return) == ("elr", False)
        assert empty(case, "leader_lost", "unclean_recovery")


def test_last_replica_standing_clean_restart_returns_it_from_the_elr() -> None:
    """ISR [1], ELR [2] with 2 fenced (down), MinISR 2: the last replica standing; restart 1.

    Clean: 1 leaves the ISR: empty; ELR [1,2] (rule 1); no active ELR member (1 stops,
    2 is fenced), so no leader: under MinISR and leader lost. Its clean registration
    keeps it in the ELR; its unfence elects it from the ELR (rule 4, case B): leader 1,
    ISR [1], ELR [2]. No recovery (balanced: the ELR is not empty).

    Unclean: the same while down; then its unclean registration takes it out of the ELR
    into the LastKnownELR (KIP-966 step 6): ELR [2], LKELR [1], still leaderless, waiting
    for 2 (fenced) to come back cleanly. Balanced recovers only once ISR and ELR are both
    empty: no unclean recovery; the partition stays without a leader."""
    c = started()
    c.alter([1, 2])
    c.fence(2)
    assert c.view() == (1, [1], [2], [])
    r = plan(c, 1)
    for case in (r.clean, r.unclean):
        assert rows(case, "under_min_isr") == [("t-0", 1, -1, [], [1, 2], [])]
        assert rows(case, "leader_lost") == [("t-0", 1, -1, [], [1, 2], [])]
        assert empty(case, "unclean_recovery")
    assert rows(r.clean, "elected_from_elr") == [("t-0", 1, 1, [1], [2], [])]
    assert only(r.clean, "elected_from_elr").on_return
    assert empty(r.unclean, "elected_from_elr")


def test_last_replica_standing_proactive_recovers_while_it_is_down() -> None:
    """As above, with a proactive topic: while 1 is down the ISR is empty and its ELR
    members [1,2] are all inactive, so proactive triggers ("elr_all_fenced") and inspects
    every replica, [1,2,3], for its window (1000 ms) before electing the best log.

    Clean: 1's return elects it from the ELR first (rule 4), which ends the recovery:
    pending only until it is back (`until_return`). Unclean: its unclean registration
    moves 1 to the LastKnownELR (ISR [], ELR [2] still fenced, LKELR [1]): no clean
    candidate is active, so the recovery stays pending after its return, listed without
    `until_return`, still awaiting the logs of [1,2,3]."""
    c = started(strategy="proactive")
    c.alter([1, 2])
    c.fence(2)
    r = plan(c, 1)
    need = only(r.clean, "unclean_recovery").recovery
    assert need == RecoveryNeed(
        strategy="proactive", trigger="elr_all_fenced", awaiting=[1, 2, 3], window_ms=1000,
        until_return=True,
    )  # fmt: skip
    p = only(r.unclean, "unclean_recovery")
    assert p.recovery == RecoveryNeed(
        strategy="proactive", trigger="elr_all_fenced", awaiting=[1, 2, 3], window_ms=1000
    )
    assert (p.leader, p.isr, p.elr, p.last_known_elr) == (-1, [], [2], [1])


@pytest.mark.parametrize(
    ("strategy", "need"),
    [
        # Balanced: ISR and ELR empty; it waits for the log of every LastKnownELR member.
        ("balanced", RecoveryNeed(strategy="balanced", trigger="isr_and_elr_empty", awaiting=[1])),
        # Manual: no policy acts; an operator must elect.
        ("manual", RecoveryNeed(strategy="manual", operator=True)),
    ],
)
def test_single_replica_unclean_restart_needs_an_unclean_recovery(
    strategy: str, need: RecoveryNeed
) -> None:
    """Topic r: replicas [1], ISR [1], MinISR 1 (RF 1); restart 1.

    Either way 1 leaves the ISR: empty, 0 < MinISR 1, so 1 joins the ELR; no active ELR
    member: no leader. Under MinISR and leader lost in both cases.

    Clean: its unfence elects it from the ELR (rule 4): leader 1, ISR [1], ELR []; no
    recovery. Unclean: its unclean registration moves it to the LastKnownELR: ISR [],
    ELR [], LKELR [1], no clean candidate left: an unclean recovery. Balanced waits for
    the log of each LastKnownELR member, [1] (then elects it: a potential data loss);
    manual never acts."""
    c = Cluster()
    c.start(1, 2)
    c.create("r", assignments=[[1]], min_isr=1, recovery_strategy=strategy)
    r = plan(c, 1)
    for case in (r.clean, r.unclean):
        assert rows(case, "under_min_isr") == [("r-0", 1, -1, [], [1], [])]
        assert rows(case, "leader_lost") == [("r-0", 1, -1, [], [1], [])]
    assert rows(r.clean, "elected_from_elr") == [("r-0", 1, 1, [1], [], [])]
    assert empty(r.clean, "unclean_recovery")
    assert empty(r.unclean, "elected_from_elr")
    assert rows(r.unclean, "unclean_recovery") == [("r-0", 1, -1, [], [], [1])]
    assert only(r.unclean, "unclean_recovery").recovery == need


def test_classic_rules_keep_the_last_isr_member() -> None:
    """The classic rules (ELR off): replicas [1], ISR [1]; restart 1. The ISR keeps its
    last member (it never empties), so there is no ELR: no leader while 1 is down (under
    MinISR? the ISR is still [1] = MinISR 1: no). Either return elects it again from the
    ISR (classic rule 4): no ELR election, no recovery."""
    c = Cluster(ControllerConfig(eligible_leader_replicas=False))
    c.start(1, 2)
    c.create("r", assignments=[[1]], min_isr=1)
    r = plan(c, 1)
    for case in (r.clean, r.unclean):
        assert rows(case, "leader_lost") == [("r-0", 1, -1, [1], [], [])]
        assert empty(case, "under_min_isr", "elected_from_elr", "unclean_recovery")


def test_lists_are_cut_to_the_limit_and_counted_whole() -> None:
    """Ten RF-1 partitions on broker 1: all ten go under MinISR and lose their leader;
    with limit 3 each list shows the first three in partition order and counts ten."""
    c = Cluster()
    c.start(1, 2)
    c.create("r", assignments=[[1]] * 10, min_isr=1)
    r = plan(c, 1, limit=3)
    for case in (r.clean, r.unclean):
        assert case.under_min_isr.count == case.leader_lost.count == 10
        assert [p.partition for p in case.under_min_isr.partitions] == [0, 1, 2]
    r = plan(c, 1, limit=0)
    assert r.clean.leader_lost.count == 10 and r.clean.leader_lost.partitions == []


def test_a_broker_that_is_not_up_has_no_restart_to_plan() -> None:
    c = started()
    with pytest.raises(BrokerIdNotRegisteredError):
        plan(c, 9)
    c.fence(3)
    with pytest.raises(InvalidRequestError, match="fenced"):
        plan(c, 3)
    c.shutdown(2)
    with pytest.raises(InvalidRequestError, match="controlled shutdown"):
        plan(c, 2)
    with pytest.raises(InvalidRequestError):
        plan(c, -1)


def test_classic_unclean_leader_election_is_an_unclean_recovery_at_once() -> None:
    """The classic rules with unclean leader election on: r: replicas [1,2], ISR [1] (2
    lags), MinISR 1; restart 1. Either way no ISR member is active once 1 goes, and the
    step's recovery evaluation elects the first active replica, 2, at once without
    looking at logs (strategy unclean_leader_election, trigger no_live_isr_member): the
    partition is led throughout (no leader lost, ISR [2] at MinISR) but by a replica that
    may miss acknowledged records: listed as an unclean recovery, chosen 2."""
    c = Cluster(ControllerConfig(eligible_leader_replicas=False, unclean_leader_election=True))
    c.start(1, 2)
    c.create("r", assignments=[[1, 2]], min_isr=1)
    c.alter([1], topic="r")
    r = plan(c, 1)
    for case in (r.clean, r.unclean):
        assert empty(case, "under_min_isr", "leader_lost", "elected_from_elr")
        p = only(case, "unclean_recovery")
        assert (p.leader_before, p.leader, p.isr, p.election) == (1, 2, [2], "unclean_recovery")
        assert p.recovery == RecoveryNeed(
            strategy="unclean_leader_election", trigger="no_live_isr_member", chosen=2
        )
