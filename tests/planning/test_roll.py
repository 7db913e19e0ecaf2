"""`planning.plan_roll` against orders worked out by hand.

The rules the answers follow (planning/roll.py): a broker may go when its controlled
shutdown leaves no partition it changes below MinISR or without a leader (rule 5 takes
it out of every ISR it is in; a partition already below MinISR whose ISR it is in blocks
it too). A step is its
shutdown, clean registration, unfence, and its leaders' AlterPartitions taking it back
into every ISR of a partition it hosts that has an active leader (a lagging replica
rejoins too). Among the brokers that may go, the one leading the fewest partitions goes
first, then the lowest id. Leadership moves off a stopping broker to the first active
ISR member in replica order (rule 2's order) and does not come back by itself.
"""

from __future__ import annotations

from controller.core.config import ControllerConfig
from planning.roll import plan_roll
from protocol.messages.plan import PlanRollResponse, RollStep, TopicPartitions
from tests.controller.testkit import Cluster

NOW = 1_000_000


def plan(c: Cluster, limit: int | None = None) -> PlanRollResponse:
    before = c.image
    r = plan_roll(c.image, rules=c.rules, now_ms=NOW, limit=limit)
    assert c.image is before and c.image.same_state(before)
    return r


def order(r: PlanRollResponse) -> list[int]:
    return [s.broker_id for s in r.steps]


def test_a_healthy_cluster_rolls_leaders_fewest_first() -> None:
    """Brokers 1-3; topic t with partitions [1,2,3], [2,3,1], [3,1,2], MinISR 2: each
    broker leads one partition; every ISR is [1,2,3], so any one broker may go (ISR 2 =
    MinISR: 3 partitions at MinISR while it is down).

    Step 1: all lead 1; the lowest id, 1, goes. t-0's leadership moves to 2 (first active
    ISR member of [1,2,3]); 1 rejoins all three ISRs. Leads now: 2 -> 2 (t-0, t-1), 3 -> 1.
    Step 2: 3 (leads 1). t-2 ([3,1,2]) moves to 1. Leads: 2 -> 2. Step 3: 2 (leads 2).
    Order [1, 3, 2]; each step awaits its broker back in t-0, t-1 and t-2."""
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2, 3], [2, 3, 1], [3, 1, 2]], min_isr=2)
    r = plan(c)
    assert r.steps == [
        RollStep(broker_id=b, leads=leads, at_min_isr=3, await_count=3,
                 awaits=[TopicPartitions(topic="t", partitions=[0, 1, 2])])
        for b, leads in ((1, 1), (3, 1), (2, 2))
    ]  # fmt: skip
    assert (r.blocked, r.blocking, r.not_rolled, r.under_min_isr.count) == ([], [], [], 0)


def test_a_lagging_replica_goes_first_and_unblocks_the_others() -> None:
    """Topic a: replicas [1,2,3], ISR [1,2] (3 lags), MinISR 2, leader 1. 1 and 2 are
    blocked (either leaving makes the ISR [x] < 2); 3 is in no ISR, so it may go. Its
    step takes it back into the ISR: [1,2,3] (case E). Now 1 and 2 may go: 2 leads
    nothing, 1 leads a-0, so 2 then 1. Order [3, 2, 1]; nothing blocked at the end."""
    c = Cluster()
    c.start(1, 2, 3)
    c.create("a", assignments=[[1, 2, 3]], min_isr=2)
    c.alter([1, 2], topic="a")
    r = plan(c)
    assert order(r) == [3, 2, 1]
    assert [s.at_min_isr for s in r.steps] == [0, 1, 1]
    assert r.blocked == [] and r.blocking_count == 0


def test_a_partition_at_rf_equal_min_isr_blocks_its_brokers() -> None:
    """Brokers 1-4. Topic b: replicas [1,2], MinISR 2 (RF = MinISR: no broker of it can
    ever leave). Topic d: replicas [3,4,1], MinISR 2, healthy, leader 3.

    1 and 2 are blocked by b-0 (its ISR would be 1 < 2); 3 and 4 may go: 4 leads nothing,
    so 4 first, then 3 (d-0's leadership moves to 4). The roll is impossible for 1 and
    2: b-0 blocks [1, 2], as it is once 3 and 4 are done (leader 1, ISR [1,2])."""
    c = Cluster()
    c.start(1, 2, 3, 4)
    c.create("b", assignments=[[1, 2]], min_isr=2)
    c.create("d", assignments=[[3, 4, 1]], min_isr=2)
    r = plan(c)
    assert order(r) == [4, 3]
    assert r.blocked == [1, 2] and r.blocking_count == 1
    (b,) = r.blocking
    assert (b.topic, b.partition, b.min_isr, b.replicas, b.isr, b.leader, b.blocks) == (
        "b", 0, 2, [1, 2], [1, 2], 1, [1, 2]
    )  # fmt: skip


def test_a_partition_already_under_min_isr_blocks_the_brokers_in_its_isr_only() -> None:
    """Topic u: replicas [1,2,3], MinISR 2, leader 1, ISR [1]: 3 lagged out of it (ISR
    [1,2]), then 2 was fenced (ISR [1], ELR [2]: case A) and came back cleanly (unfenced,
    still out of the ISR, still in the ELR: 1 leads). Before the roll u-0 is
    under MinISR (listed). 1 is blocked (its leaving would sink it to 0); 2 and 3 may go,
    and each step takes its broker back into u-0's ISR: after 2, ISR [1,2] = MinISR
    (rule 1 clears the ELR, case G), 1 still blocked (1 < 2); after 3, ISR [1,2,3] and
    1 may go. Leads: 2 and 3 lead nothing: 2, 3, then 1. Order [2, 3, 1]."""
    c = Cluster()
    c.start(1, 2, 3)
    c.create("u", assignments=[[1, 2, 3]], min_isr=2)
    c.alter([1, 2], topic="u")
    c.fence(2)
    c.restart(2, clean=True)
    assert c.view("u") == (1, [1], [2], [])
    r = plan(c)
    assert [(p.topic, p.partition, p.isr) for p in r.under_min_isr.partitions] == [("u", 0, [1])]
    assert order(r) == [2, 3, 1]
    assert r.blocked == []


def test_down_brokers_are_not_rolled() -> None:
    """A fenced broker is down already and one in controlled shutdown is stopping: the
    roll leaves both out, and restarts the others."""
    c = Cluster()
    c.start(1, 2, 3, 4)
    c.create("t", assignments=[[1, 2, 3, 4]], min_isr=1)
    c.fence(3)
    c.shutdown(4)
    r = plan(c)
    assert [(n.broker_id, n.reason) for n in r.not_rolled] == [
        (3, "fenced"), (4, "controlled_shutdown")
    ]  # fmt: skip
    assert sorted(order(r)) == [1, 2]


def test_await_lists_are_cut_to_the_limit_and_counted_whole() -> None:
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", partitions=12, replication_factor=3, min_isr=1)
    r = plan(c, limit=5)
    assert [s.await_count for s in r.steps] == [12, 12, 12]
    assert all(sum(len(g.partitions) for g in s.awaits) == 5 for s in r.steps)


def test_under_the_classic_rules_a_lost_leader_blocks() -> None:
    """The classic rules (ELR off): r: replicas [1], MinISR 1; t: replicas [1,2], MinISR 1.
    1's controlled shutdown keeps it in r-0's ISR (the classic rules never empty an ISR):
    ISR [1] is not below MinISR, but r-0 has no leader while 1 is down: that blocks 1.
    2 may go (t-0 keeps ISR [1] and leader 1). Order [2]; 1 blocked by r-0."""
    c = Cluster(ControllerConfig(eligible_leader_replicas=False))
    c.start(1, 2)
    c.create("r", assignments=[[1]], min_isr=1)
    c.create("t", assignments=[[1, 2]], min_isr=1)
    r = plan(c)
    assert order(r) == [2] and r.blocked == [1]
    assert [(b.topic, b.isr, b.min_isr, b.blocks) for b in r.blocking] == [("r", [1], 1, [1])]


def test_under_the_classic_rules_an_unclean_election_blocks() -> None:
    """The classic rules with unclean leader election on: r: replicas [1,2], ISR [1] (2
    lags), MinISR 1; s: replicas [2], MinISR 1. 2 is blocked by s-0 (the classic rules
    keep it in s-0's ISR, but s-0 would have no leader). 1's controlled shutdown leaves
    r-0 no active ISR member, so the step's recovery evaluation elects 2 at once,
    uncleanly (a potential data loss): r-0's ISR [2] is at MinISR and it has a leader,
    but that blocks 1. (Were 2 free, its restart would take it back into r-0's ISR first,
    and 1 could go: the lag, not the rules, is what the roll waits on.)"""
    c = Cluster(ControllerConfig(eligible_leader_replicas=False, unclean_leader_election=True))
    c.start(1, 2)
    c.create("r", assignments=[[1, 2]], min_isr=1)
    c.create("s", assignments=[[2]], min_isr=1)
    c.alter([1], topic="r")
    r = plan(c)
    assert order(r) == [] and r.blocked == [1, 2]
    assert [(b.topic, b.blocks) for b in r.blocking] == [("r", [1]), ("s", [2])]
