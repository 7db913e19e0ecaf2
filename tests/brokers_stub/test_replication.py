"""The pure replication decisions: divergence and truncation, catch-up, HW, ISR changes.

The divergence cases follow reliability-leader-epoch-zh.md (why leader epochs replaced
HW-based truncation): the restarted follower that must *not* truncate (case 1) and the
two logs that diverged at the same offset (case 2). A property test then drives random
histories made the way real ones are (one leader per epoch, whose log only grows while it
leads; followers copy or lose a suffix) and checks that one diverging fetch is enough and
never costs a shared record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import example, given, settings
from hypothesis import strategies as st

from brokers_stub.replica_log import NO_EPOCH, EpochEntry, last_written_epoch
from brokers_stub.replication import (
    FollowerFetchState,
    divergence,
    follower_truncation,
    isr_change,
    join_floor,
    next_high_watermark,
    record_fetch,
)

# --- divergence: the cases of reliability-leader-epoch-zh.md -----------------------------


def test_case1_restarted_follower_keeps_its_records() -> None:
    # B leads epoch 0 with m1, m2; A copied both (LEO 2) but its HW was still 1 when it
    # restarted. HW-based truncation would drop m2; the epoch check keeps it.
    b_history, b_leo = [(0, 0)], 2
    a_history, a_leo = [(0, 0)], 2
    assert divergence(b_history, b_leo, last_written_epoch(a_history, a_leo), a_leo) is None
    # And if B then dies and A leads epoch 1, B follows A without losing m2 either.
    a_history = [(0, 0), (1, 2)]
    assert divergence(a_history, a_leo, 0, 2) is None


def test_case2_diverged_logs_truncate_to_the_epoch_boundary() -> None:
    # A led epoch 0 with m1, m2; B had only m1. Both crashed; B came back first, leads
    # epoch 1 and wrote m3 at offset 1. A returns as a follower with m1, m2.
    b_history, b_leo = [(0, 0), (1, 1)], 2
    a_history, a_leo = [(0, 0)], 2
    truncate_to = divergence(b_history, b_leo, 0, a_leo)
    assert truncate_to == 1  # the end of epoch 0 in B's history
    assert follower_truncation(a_history, a_leo, b_history, b_leo, truncate_to) == 1
    # After truncating to [m1] A's log is a prefix of B's: no more divergence.
    assert divergence(b_history, b_leo, 0, 1) is None


def test_follower_ahead_in_the_same_epoch_truncates_to_the_leader_end() -> None:
    # The new leader lost unflushed records of the epoch both logs end in.
    assert divergence([(0, 0), (1, 5)], 7, 1, 10) == 7


def test_follower_with_an_epoch_the_leader_never_saw() -> None:
    leader, leader_leo = [(0, 0), (1, 5), (3, 9)], 12
    follower, follower_leo = [(0, 0), (2, 5)], 10
    truncate_to = divergence(leader, leader_leo, 2, follower_leo)
    assert truncate_to == 9  # the end of epoch 1, the largest the leader has below 2
    # The follower's records from 5 on are epoch 2, not 1: it keeps only 0..4, in one go.
    point = follower_truncation(follower, follower_leo, leader, leader_leo, truncate_to)
    assert point == 5
    assert divergence(leader, leader_leo, 0, point) is None


def test_leader_that_lost_records_leads_again_in_a_newer_epoch() -> None:
    # 1 led epoch 1 with [e0, e1]; 2 copied both. 1 crashed and lost both records. It can
    # only lead again after a fence (a leader change: a new epoch) and a new election, so
    # what it writes next is epoch 2, and 2's records (epochs 0 and 1) are all foreign.
    leader, leader_leo = [(2, 0)], 2
    follower, follower_leo = [(0, 0), (1, 1)], 2
    truncate_to = divergence(leader, leader_leo, 1, follower_leo)
    assert truncate_to == 0
    assert follower_truncation(follower, follower_leo, leader, leader_leo, truncate_to) == 0


def test_empty_logs_and_logs_without_epochs() -> None:
    assert divergence([(0, 0)], 5, NO_EPOCH, 0) is None
    assert divergence([(0, 0)], 5, NO_EPOCH, 3) == 0
    # Without a leader history the follower falls back to the leader's truncate_to.
    assert follower_truncation([(0, 0)], 10, [], 0, 4) == 4


# --- divergence: randomized, histories made like real ones -------------------------------


@dataclass
class Model:
    """Real logs as one epoch per record; histories derived from them.

    `leader` is None between a crash of the leader and the next election: a replica loses
    records only in a crash, and a crashed leader is fenced (the controller moves the
    leadership away, a new leader epoch) before it registers again. So a leader's log
    never shrinks within its epoch, which is what lets (epoch, offset) name one record.
    """

    logs: dict[int, list[int]] = field(default_factory=lambda: {1: [], 2: [], 3: []})
    leader: int | None = 1
    epoch: int = 0
    started: dict[int, int] = field(default_factory=dict)  # leader epoch -> start offset

    def history(self, r: int) -> list[EpochEntry]:
        log, out = self.logs[r], []
        for i, e in enumerate(log):
            if not out or out[-1][0] != e:
                out.append((e, i))
        if r == self.leader and (not out or out[-1][0] != self.epoch):
            out.append((self.epoch, len(log)))
        return out


def shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


ops = st.lists(
    st.one_of(
        st.tuples(st.just("elect"), st.integers(1, 3), st.just(0)),
        st.tuples(st.just("append"), st.just(0), st.integers(1, 4)),
        st.tuples(st.just("sync"), st.integers(1, 3), st.just(0)),
        st.tuples(st.just("lose"), st.integers(1, 3), st.integers(1, 4)),
    ),
    max_size=40,
)


# A leader that lost records used to go on appending in the same epoch: an impossible
# history, whose epoch 1 named different records on the two replicas (see Model).
LEADER_LOSES_THEN_APPENDS = [
    ("append", 0, 1),
    ("elect", 1, 0),
    ("append", 0, 1),
    ("sync", 2, 0),
    ("lose", 1, 1),
    ("lose", 1, 1),
    ("append", 0, 2),
    ("sync", 2, 0),
]


@settings(max_examples=300, deadline=None)
@given(ops)
@example(LEADER_LOSES_THEN_APPENDS)
@example([*LEADER_LOSES_THEN_APPENDS[:6], ("elect", 1, 0), *LEADER_LOSES_THEN_APPENDS[6:]])
@example([*LEADER_LOSES_THEN_APPENDS[:5], ("elect", 3, 0), *LEADER_LOSES_THEN_APPENDS[6:]])
def test_one_diverging_fetch_finds_exactly_the_shared_prefix(
    steps: list[tuple[str, int, int]],
) -> None:
    m = Model()
    for op, r, n in steps:
        if op == "elect":
            m.epoch += 1
            m.leader = r
        elif op == "append" and m.leader is not None:
            m.logs[m.leader].extend([m.epoch] * n)
        elif op == "lose":
            del m.logs[r][max(0, len(m.logs[r]) - n) :]
            if r == m.leader:
                m.leader = None  # crashed: fenced, no leader until the next election
        elif op == "sync" and m.leader is not None and r != m.leader:
            leader_log, follower_log = m.logs[m.leader], m.logs[r]
            lh, fh = m.history(m.leader), m.history(r)
            truncate_to = divergence(
                lh, len(leader_log), last_written_epoch(fh, len(follower_log)), len(follower_log)
            )
            shared = shared_prefix(leader_log, follower_log)
            if truncate_to is None:
                assert shared == len(follower_log)  # no divergence missed
            else:
                point = follower_truncation(fh, len(follower_log), lh, len(leader_log), truncate_to)
                assert point == shared  # nothing shared is dropped, nothing foreign kept
                del follower_log[point:]
                fh = m.history(r)
                again = divergence(
                    lh, len(leader_log), last_written_epoch(fh, len(follower_log)), point
                )
                assert again is None
            follower_log[:] = leader_log


# --- catch-up ---------------------------------------------------------------------------


def test_record_fetch_follows_kafka_caught_up_rule() -> None:
    s1 = record_fetch(None, broker_epoch=7, fetch_offset=5, leader_leo=10, now_ms=1000)
    assert not s1.caught_up
    assert s1.last_caught_up_ms is None
    # It now holds what we had at its previous fetch (10), though we have moved on to 14:
    # caught up since that previous fetch.
    s2 = record_fetch(s1, broker_epoch=7, fetch_offset=10, leader_leo=14, now_ms=1100)
    assert s2.caught_up
    assert s2.last_caught_up_ms == 1000
    s3 = record_fetch(s2, broker_epoch=7, fetch_offset=14, leader_leo=14, now_ms=1200)
    assert s3.caught_up
    assert s3.last_caught_up_ms == 1200
    s4 = record_fetch(s3, broker_epoch=7, fetch_offset=14, leader_leo=30, now_ms=1300)
    assert s4.caught_up  # it has all we had at 1200
    assert s4.last_caught_up_ms == 1200
    s5 = record_fetch(s4, broker_epoch=7, fetch_offset=20, leader_leo=40, now_ms=1400)
    assert not s5.caught_up  # short of what we had at 1300
    assert s5.last_caught_up_ms == 1200


# --- high watermark ---------------------------------------------------------------------


def hw(**kw: object) -> int:
    args: dict[str, object] = {
        "current_hw": 10,
        "leader_id": 1,
        "leader_leo": 50,
        "isr": {1, 2, 3},
        "min_isr": 2,
        "follower_offsets": {2: 40, 3: 30},
    }
    args.update(kw)
    return next_high_watermark(**args)  # type: ignore[arg-type]


def test_hw_is_the_smallest_isr_offset() -> None:
    assert hw() == 30
    assert hw(follower_offsets={2: 40, 3: 60}) == 40
    assert hw(isr={1, 2}) == 40  # 3 is not in the ISR: its offset does not count
    assert hw(isr={1}, min_isr=1) == 50  # alone and allowed: the leader's LEO


def test_hw_does_not_advance_while_the_isr_is_below_min_isr() -> None:
    """KIP-966: the HW advances only while |ISR| >= min.insync.replicas."""
    assert hw(isr={1}, min_isr=2) == 10
    assert hw(isr={1, 2}, min_isr=3) == 10
    assert hw(isr={1, 2}, min_isr=2) == 40


def test_hw_waits_for_members_that_have_not_fetched_and_never_goes_back() -> None:
    assert hw(follower_offsets={2: 40, 3: None}) == 10
    assert hw(follower_offsets={2: 40}) == 10
    assert hw(current_hw=35) == 35  # the ISR minimum (30) is below: keep 35


def test_hw_counts_a_member_joining_in_an_isr_change_in_flight() -> None:
    assert hw(isr={1, 2}, pending_isr={1, 2, 3}) == 30


# --- ISR changes ------------------------------------------------------------------------

LAG = 3000
ACTIVE = {1: 100, 2: 200, 3: 300}


def follower(
    *,
    epoch: int = 0,
    fetch_ms: int | None = None,
    caught_up_ms: int | None = None,
    ok: bool,
    offset: int = 0,
) -> FollowerFetchState:
    return FollowerFetchState(
        broker_epoch=epoch,
        fetch_offset=offset if fetch_ms is not None else None,
        last_fetch_ms=fetch_ms,
        last_caught_up_ms=caught_up_ms,
        caught_up=ok,
    )


def change(
    isr: set[int],
    followers: dict[int, FollowerFetchState],
    now: int = 10_000,
    active: dict[int, int] | None = None,
    floor: int = 0,
) -> frozenset[int] | None:
    return isr_change(
        leader_id=1,
        isr=frozenset(isr),
        replicas=[1, 2, 3],
        followers=followers,
        active_epochs=ACTIVE if active is None else active,
        now_ms=now,
        lag_max_ms=LAG,
        join_floor=floor,
    )


def test_a_caught_up_follower_joins_only_once_it_reaches_the_high_watermark() -> None:
    # Caught up at its last fetch (offset 40), but the HW has since moved to 50 with
    # records the current ISR acknowledged: joining now would let a clean election lose
    # them. Found by `metactl simulate faults` (ELR balanced, seed 1, schedule 32).
    f = {3: follower(epoch=300, fetch_ms=9900, caught_up_ms=9900, ok=True, offset=40)}
    assert change({1, 2}, f, floor=50) is None
    assert change({1, 2}, f, floor=40) == {1, 2, 3}


def test_the_join_floor_is_the_hw_and_the_start_of_the_leaders_epoch() -> None:
    history = [(0, 0), (3, 70), (5, 120)]
    assert join_floor(100, history, 5) == 120  # the epoch started after the HW
    assert join_floor(130, history, 5) == 130
    assert join_floor(10, history, 3) == 70
    assert join_floor(10, history, 9) == 10  # an epoch not in the history: the HW


def test_a_caught_up_follower_joins_the_isr() -> None:
    f = {
        2: follower(epoch=200, fetch_ms=9900, caught_up_ms=9900, ok=True),
        3: follower(epoch=300, fetch_ms=9900, caught_up_ms=9800, ok=True),
    }
    assert change({1, 2}, f) == {1, 2, 3}
    assert change({1, 2, 3}, f) is None


def test_followers_that_cannot_join() -> None:
    base = {2: follower(epoch=200, fetch_ms=9900, caught_up_ms=9900, ok=True)}
    behind = {**base, 3: follower(epoch=300, fetch_ms=9900, caught_up_ms=None, ok=False)}
    assert change({1, 2}, behind) is None
    stale_epoch = {**base, 3: follower(epoch=299, fetch_ms=9900, caught_up_ms=9900, ok=True)}
    assert change({1, 2}, stale_epoch) is None
    fenced = {**base, 3: follower(epoch=300, fetch_ms=9900, caught_up_ms=9900, ok=True)}
    assert change({1, 2}, fenced, active={1: 100, 2: 200}) is None
    long_ago = {**base, 3: follower(epoch=300, fetch_ms=6000, caught_up_ms=5000, ok=True)}
    assert change({1, 2}, long_ago) is None
    assert change({1, 2}, base) is None  # 3 never fetched


def test_a_lagging_follower_leaves_the_isr() -> None:
    f = {
        2: follower(epoch=200, fetch_ms=9900, caught_up_ms=9900, ok=True),
        3: follower(epoch=300, fetch_ms=9900, caught_up_ms=6999, ok=False),
    }
    assert change({1, 2, 3}, f) == {1, 2}
    f[3] = follower(epoch=300, fetch_ms=9900, caught_up_ms=7000, ok=False)
    assert change({1, 2, 3}, f) is None  # exactly at the limit: still in


def test_isr_members_not_yet_heard_from_stay_and_inactive_ones_go() -> None:
    assert change({1, 2, 3}, {}) is None
    assert change({1, 2, 3}, {}, active={1: 100, 2: 200}) == {1, 2}


def test_the_leader_always_stays_in_the_isr() -> None:
    assert change({2}, {2: follower(epoch=200, fetch_ms=9900, caught_up_ms=9900, ok=True)}) == {
        1,
        2,
    }


follower_states = st.builds(
    FollowerFetchState,
    broker_epoch=st.sampled_from([None, 200, 300, 1]),
    fetch_offset=st.one_of(st.none(), st.integers(0, 100)),
    last_fetch_ms=st.one_of(st.none(), st.integers(0, 10_000)),
    last_caught_up_ms=st.one_of(st.none(), st.integers(0, 10_000)),
    caught_up=st.booleans(),
)


@settings(max_examples=500, deadline=None)
@given(
    isr=st.sets(st.sampled_from([1, 2, 3])),
    followers=st.dictionaries(st.sampled_from([2, 3]), follower_states),
    active=st.dictionaries(st.sampled_from([1, 2, 3]), st.sampled_from([100, 200, 300])),
)
def test_isr_change_is_stable(
    isr: set[int], followers: dict[int, FollowerFetchState], active: dict[int, int]
) -> None:
    """Asking again with the proposed ISR changes nothing: no shrink/expand flapping."""
    first = change(isr, followers, active=active, floor=50)
    settled = frozenset(isr) if first is None else first
    assert 1 in settled
    assert change(set(settled), followers, active=active, floor=50) is None
