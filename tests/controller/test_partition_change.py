"""Rule 1 (ISR -> ELR/LastKnownELR), rule 2's election order, and cases A-G of section 5.2.1.

The pure functions are tested directly; each case A-G is also replayed through the
handler that triggers it in the cluster (fence, unfence, AlterPartition).
"""

from __future__ import annotations

import pytest

from controller.core.partition_change import build_change, clean_leader, next_elr
from metadata_image.state import EMPTY
from metadata_log.records import (
    NO_LEADER,
    ChangeReason,
    ElectionKind,
    LeaderRecoveryState,
    PartitionChangeRecord,
    PartitionRecord,
)

from .testkit import Cluster, image_of


def fs(*xs: int) -> frozenset[int]:
    return frozenset(xs)


# --- rule 1: next_elr --------------------------------------------------------------------


class TestNextElr:
    def test_at_min_isr_both_sets_are_cleared(self) -> None:
        assert next_elr(fs(1, 2, 3), fs(1, 2), fs(4), fs(5), 2) == (EMPTY, EMPTY)

    def test_above_min_isr_both_sets_are_cleared(self) -> None:
        assert next_elr(fs(1), fs(1, 2, 3), fs(4), fs(5), 2) == (EMPTY, EMPTY)

    def test_below_min_isr_removed_members_join_the_elr(self) -> None:
        elr, lkelr = next_elr(fs(1, 2), fs(1), fs(3), fs(4), 2)
        assert elr == fs(2, 3)
        assert lkelr == fs(4)

    def test_below_min_isr_members_entering_the_isr_leave_elr_and_last_known_elr(self) -> None:
        # O = {1}, N = {1, 2}: 2 leaves the ELR; 3 stays; 4 re-enters and leaves the LKELR.
        elr, lkelr = next_elr(fs(1), fs(1, 2, 4), fs(2, 3), fs(4, 5), 4)
        assert elr == fs(3)
        assert lkelr == fs(5)

    def test_shrinking_to_empty_moves_everyone_to_the_elr(self) -> None:
        assert next_elr(fs(1, 2), EMPTY, fs(3), EMPTY, 3) == (fs(1, 2, 3), EMPTY)

    def test_unchanged_isr_below_min_isr_keeps_the_sets(self) -> None:
        assert next_elr(fs(1), fs(1), fs(2), fs(3), 2) == (fs(2), fs(3))

    def test_min_isr_of_one_never_keeps_an_elr_once_the_isr_is_non_empty(self) -> None:
        assert next_elr(fs(1, 2), fs(2), fs(3), fs(4), 1) == (EMPTY, EMPTY)
        assert next_elr(fs(2), EMPTY, EMPTY, fs(4), 1) == (fs(2), fs(4))


# --- rule 2's order: clean_leader --------------------------------------------------------


def _p(**kw: object) -> PartitionRecord:
    fields: dict[str, object] = {
        "topic": "t",
        "partition": 0,
        "replicas": [3, 2, 1],
        "isr": [],
        "min_isr": 2,
    }
    fields.update(kw)
    return PartitionRecord(**fields)  # type: ignore[arg-type]


class TestCleanLeader:
    def test_keeps_the_current_leader_if_it_is_an_active_isr_member(self) -> None:
        image = image_of(active=[1, 2, 3], partitions=[_p(isr=[1, 2, 3], leader=1)])
        p = image.partitions[("t", 0)]
        assert clean_leader(image, p, p.isr, p.elr) == (1, None)

    def test_first_active_isr_member_in_assignment_order_not_in_id_order(self) -> None:
        image = image_of(active=[1, 2], fenced=[3], partitions=[_p(isr=[1, 2, 3], leader=3)])
        p = image.partitions[("t", 0)]
        assert clean_leader(image, p, fs(1, 2), EMPTY) == (2, ElectionKind.ISR)

    def test_current_leader_no_longer_in_the_isr_is_replaced(self) -> None:
        image = image_of(active=[1, 2, 3], partitions=[_p(isr=[1, 2, 3], leader=3)])
        p = image.partitions[("t", 0)]
        assert clean_leader(image, p, fs(1, 2), EMPTY) == (2, ElectionKind.ISR)

    def test_isr_members_that_are_not_active_are_skipped(self) -> None:
        image = image_of(active=[1], fenced=[2, 3], partitions=[_p(isr=[1, 2, 3], leader=3)])
        p = image.partitions[("t", 0)]
        assert clean_leader(image, p, fs(1, 2), EMPTY) == (1, ElectionKind.ISR)

    def test_no_active_isr_member_and_non_empty_isr_means_no_leader_even_with_active_elr(
        self,
    ) -> None:
        # The ELR is only consulted when the ISR is empty.
        image = image_of(active=[1], fenced=[2, 3], partitions=[_p(isr=[2], elr=[1], leader=2)])
        p = image.partitions[("t", 0)]
        assert clean_leader(image, p, fs(2), fs(1)) == (NO_LEADER, None)

    def test_empty_isr_elects_the_first_active_elr_member_in_assignment_order(self) -> None:
        image = image_of(active=[1, 2], fenced=[3], partitions=[_p(elr=[1, 2, 3])])
        p = image.partitions[("t", 0)]
        assert clean_leader(image, p, EMPTY, fs(1, 2, 3)) == (2, ElectionKind.ELR)

    def test_empty_isr_and_no_active_elr_member_means_no_leader(self) -> None:
        image = image_of(fenced=[1, 2, 3], partitions=[_p(elr=[1, 2])])
        p = image.partitions[("t", 0)]
        assert clean_leader(image, p, EMPTY, fs(1, 2)) == (NO_LEADER, None)

    def test_unregistered_replica_is_never_elected(self) -> None:
        image = image_of(active=[1], partitions=[_p(replicas=[9, 1], elr=[9, 1])])
        p = image.partitions[("t", 0)]
        assert clean_leader(image, p, EMPTY, fs(9, 1)) == (1, ElectionKind.ELR)


# --- build_change ------------------------------------------------------------------------


class TestBuildChange:
    def test_nothing_changes_returns_none(self) -> None:
        image = image_of(active=[1, 2, 3], partitions=[_p(isr=[1, 2, 3], leader=3)])
        p = image.partitions[("t", 0)]
        assert build_change(image, p, reason=ChangeReason.ALTER_PARTITION) is None
        assert build_change(image, p, reason=ChangeReason.ALTER_PARTITION, target_isr=p.isr) is None

    def test_record_carries_only_what_changes_and_bumps_the_partition_epoch(self) -> None:
        image = image_of(
            active=[1, 2, 3],
            partitions=[_p(isr=[1, 2, 3], leader=3, leader_epoch=4, partition_epoch=7)],
        )
        p = image.partitions[("t", 0)]
        change = build_change(
            image, p, reason=ChangeReason.ALTER_PARTITION, target_isr=fs(3, 2), broker=3
        )
        assert change == PartitionChangeRecord(
            topic="t",
            partition=0,
            reason=ChangeReason.ALTER_PARTITION,
            partition_epoch=8,
            leader_epoch=4,
            isr=[2, 3],
            broker=3,
        )

    def test_leader_change_bumps_the_leader_epoch_and_names_the_election(self) -> None:
        image = image_of(
            active=[1, 2],
            fenced=[3],
            partitions=[_p(isr=[1, 2, 3], leader=3, leader_epoch=4, partition_epoch=7)],
        )
        p = image.partitions[("t", 0)]
        change = build_change(image, p, reason=ChangeReason.FENCE, target_isr=fs(1, 2))
        assert change is not None
        assert (change.leader, change.leader_epoch, change.partition_epoch) == (2, 5, 8)
        assert change.election is ElectionKind.ISR
        assert change.elr is None  # |{1, 2}| >= MinISR 2: 3 does not join the ELR
        assert change.last_known_elr is None

    def test_losing_the_leader_sets_no_leader_without_an_election_kind(self) -> None:
        image = image_of(fenced=[1, 2, 3], partitions=[_p(isr=[1], elr=[2], leader=1)])
        p = image.partitions[("t", 0)]
        change = build_change(image, p, reason=ChangeReason.FENCE, target_isr=EMPTY)
        assert change is not None
        assert change.leader == NO_LEADER
        assert change.election is None
        assert change.leader_epoch == 1
        assert change.isr == []
        assert change.elr == [1, 2]

    def test_elr_election_moves_the_leader_from_elr_to_isr_and_reapplies_rule_1(self) -> None:
        image = image_of(
            active=[2, 3],
            fenced=[1],
            partitions=[_p(isr=[1], elr=[2, 3], leader=1, min_isr=3)],
            min_isr=3,
        )
        p = image.partitions[("t", 0)]
        change = build_change(image, p, reason=ChangeReason.FENCE, target_isr=EMPTY)
        assert change is not None
        # Replicas are [3, 2, 1]: 3 is the first active ELR member in assignment order.
        assert (change.leader, change.election) == (3, ElectionKind.ELR)
        assert change.isr == [3]
        assert change.elr == [1, 2]

    def test_unclean_exclusion_moves_elr_members_to_last_known_elr(self) -> None:
        image = image_of(fenced=[1, 2, 3], partitions=[_p(elr=[1, 2], last_known_elr=[3])])
        p = image.partitions[("t", 0)]
        change = build_change(
            image,
            p,
            reason=ChangeReason.UNCLEAN_REGISTRATION,
            unclean_excluded=fs(2, 3),
            broker=2,
        )
        assert change is not None
        assert change.isr is None and change.leader is None
        assert change.elr == [1]
        assert change.last_known_elr == [2, 3]
        assert change.leader_epoch == 0 and change.partition_epoch == 1

    def test_unclean_exclusion_of_a_non_member_changes_nothing(self) -> None:
        image = image_of(fenced=[1, 2, 3], partitions=[_p(elr=[1])])
        p = image.partitions[("t", 0)]
        assert (
            build_change(image, p, reason=ChangeReason.UNCLEAN_REGISTRATION, unclean_excluded=fs(2))
            is None
        )

    @pytest.mark.parametrize(
        ("state", "recovered", "expected"),
        [
            (LeaderRecoveryState.RECOVERING, True, LeaderRecoveryState.RECOVERED),
            (LeaderRecoveryState.RECOVERING, False, None),
            (LeaderRecoveryState.RECOVERED, True, None),
        ],
    )
    def test_recovered_ends_a_recovery_only_when_one_is_in_progress(
        self,
        state: LeaderRecoveryState,
        recovered: bool,
        expected: LeaderRecoveryState | None,
    ) -> None:
        image = image_of(active=[3], partitions=[_p(isr=[3], leader=3, recovery_state=state)])
        p = image.partitions[("t", 0)]
        change = build_change(
            image, p, reason=ChangeReason.ALTER_PARTITION, target_isr=fs(3), recovered=recovered
        )
        if expected is None:
            assert change is None
        else:
            assert change is not None
            assert change.recovery_state is expected
            assert change.leader_epoch == 0 and change.partition_epoch == 1


# --- cases A-G (section 5.2.1), through the handlers that trigger them ----------------------


@pytest.fixture
def cluster() -> Cluster:
    """RF 3, MinISR 2, three active brokers: Leader=1, ISR=[1,2,3]."""
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", replication_factor=3, min_isr=2)
    assert c.view() == (1, [1, 2, 3], [], [])
    return c


def test_case_a_fenced_follower_joins_the_elr_when_the_isr_drops_below_min_isr(
    cluster: Cluster,
) -> None:
    cluster.alter([1, 2])  # ISR = MinISR
    cluster.fence(2)
    assert cluster.view() == (1, [1], [2], [])
    assert cluster.p().leader_epoch == 0  # the leader did not change


def test_case_b_an_unfenced_elr_member_is_elected_and_moves_to_the_isr(cluster: Cluster) -> None:
    cluster.fence(3)
    cluster.fence(2)
    cluster.fence(1)
    assert cluster.view() == (NO_LEADER, [], [1, 2], [])
    epochs = cluster.p().leader_epoch
    result = cluster.unfence(2)
    change = result.records[-1]
    assert isinstance(change, PartitionChangeRecord)
    assert change.election is ElectionKind.ELR
    assert change.reason is ChangeReason.UNFENCE
    assert cluster.view() == (2, [2], [1], [])
    assert cluster.p().leader_epoch == epochs + 1


def test_case_b_at_fence_time_an_active_elr_member_is_elected(cluster: Cluster) -> None:
    # AlterPartition shrinks the ISR below MinISR: 2 and 3 stay complete and join the ELR.
    cluster.alter([1])
    assert cluster.view() == (1, [1], [2, 3], [])
    cluster.fence(1)
    # The ISR is empty; 2 is the first active ELR member in assignment order.
    assert cluster.view() == (2, [2], [1, 3], [])


def test_case_c_fenced_leader_joins_the_elr_when_the_new_isr_is_below_min_isr(
    cluster: Cluster,
) -> None:
    cluster.alter([1, 2])
    cluster.fence(1)
    assert cluster.view() == (2, [2], [1], [])
    assert cluster.p().leader_epoch == 1


def test_case_d_fenced_leader_is_not_kept_when_the_new_isr_reaches_min_isr(
    cluster: Cluster,
) -> None:
    cluster.fence(1)
    assert cluster.view() == (2, [2, 3], [], [])
    assert cluster.p().leader_epoch == 1


def test_case_e_caught_up_follower_is_added_to_the_isr(cluster: Cluster) -> None:
    cluster.alter([1, 2])
    assert cluster.view() == (1, [1, 2], [], [])  # case F for 3
    cluster.alter([1, 2, 3])
    assert cluster.view() == (1, [1, 2, 3], [], [])
    assert cluster.p().partition_epoch == 2
    assert cluster.p().leader_epoch == 0


def test_case_f_follower_leaves_the_isr_without_joining_the_elr_at_min_isr(
    cluster: Cluster,
) -> None:
    view = cluster.alter([1, 3])
    assert cluster.view() == (1, [1, 3], [], [])
    assert view.isr == [1, 3]


def test_case_g_isr_reaching_min_isr_empties_elr_and_last_known_elr(cluster: Cluster) -> None:
    cluster.alter([1])
    cluster.fence(3)  # 3 is in the ELR and fenced
    assert cluster.view() == (1, [1], [2, 3], [])
    cluster.register(3)  # unclean: 3 moves to the LastKnownELR
    assert cluster.view() == (1, [1], [2], [3])
    cluster.alter([1, 2])
    assert cluster.view() == (1, [1, 2], [], [])
