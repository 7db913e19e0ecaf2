"""Replication decisions as pure functions: divergence, truncation, catch-up, HW, ISR.

The leader side follows Kafka: a fetch whose (last fetched epoch, fetch offset) does not
match the leader's epoch history is answered with where the follower must truncate to
(OffsetsForLeaderEpoch); a follower is *caught up* when it holds everything the leader
held at its previous fetch (Kafka's lastCaughtUpTime); the high watermark is the
smallest offset held by every ISR member and, as KIP-966 requires, advances only while
the ISR has at least min.insync.replicas members.

Every function here takes plain values and returns plain values: no IO, no clocks (the
caller passes `now_ms`), no mutation of arguments. The replica manager applies them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from brokers_stub.replica_log import NO_EPOCH, EpochEntry, common_prefix, end_offset_for_epoch


@dataclass(frozen=True, slots=True)
class FollowerFetchState:
    """What the leader remembers about one follower during one leader epoch."""

    broker_epoch: int | None = None  # the follower's broker epoch at its last fetch
    fetch_offset: int | None = None  # None: it has not fetched in this leader epoch
    last_fetch_ms: int | None = None
    leader_leo_at_fetch: int = 0  # the leader's LEO when answering that fetch
    last_caught_up_ms: int | None = None
    caught_up: bool = False  # its latest fetch showed it held all the leader had


def divergence(
    history: Sequence[EpochEntry], leo: int, last_fetched_epoch: int, fetch_offset: int
) -> int | None:
    """Leader side: None if the follower's log is a prefix of ours, else `truncate_to`.

    Kafka's rule: find the end offset, in our history, of the largest epoch not newer
    than the follower's last fetched epoch. If that epoch is not the follower's, or the
    follower's log runs past where the epoch ends for us, the logs diverge there.
    """
    if last_fetched_epoch == NO_EPOCH:
        # An empty follower log cannot diverge; a log without epochs cannot be trusted.
        return None if fetch_offset == 0 else 0
    epoch, end = end_offset_for_epoch(history, leo, last_fetched_epoch)
    if epoch != last_fetched_epoch or end < fetch_offset:
        return end
    return None


def follower_truncation(
    local_history: Sequence[EpochEntry],
    local_leo: int,
    leader_history: Sequence[EpochEntry],
    leader_leo: int,
    truncate_to: int,
) -> int:
    """Follower side: the offset to truncate to after a diverging fetch.

    The leader's `truncate_to` bounds it; when the leader also sent its epoch history
    the follower keeps exactly the prefix both logs agree on, so the next fetch cannot
    diverge again (one round trip where Kafka may need several).
    """
    point = min(max(0, truncate_to), local_leo)
    if leader_history:
        point = min(point, common_prefix(local_history, local_leo, leader_history, leader_leo))
    return point


def record_fetch(
    prev: FollowerFetchState | None,
    *,
    broker_epoch: int,
    fetch_offset: int,
    leader_leo: int,
    now_ms: int,
) -> FollowerFetchState:
    """Leader side: the follower state after a non-diverging fetch.

    Caught up (Kafka's Replica.updateFetchState): the follower holds our whole log, or
    everything we held when it last fetched; in the latter case it has been caught up
    since that previous fetch.
    """
    last = prev.last_caught_up_ms if prev is not None else None
    caught_up = False
    if fetch_offset >= leader_leo:
        caught_up = True
        last = now_ms if last is None else max(last, now_ms)
    elif (
        prev is not None
        and prev.fetch_offset is not None
        and prev.last_fetch_ms is not None
        and fetch_offset >= prev.leader_leo_at_fetch
    ):
        caught_up = True
        last = prev.last_fetch_ms if last is None else max(last, prev.last_fetch_ms)
    return FollowerFetchState(
        broker_epoch=broker_epoch,
        fetch_offset=fetch_offset,
        last_fetch_ms=now_ms,
        leader_leo_at_fetch=leader_leo,
        last_caught_up_ms=last,
        caught_up=caught_up,
    )


def reelected_follower(
    prev: FollowerFetchState, *, in_isr: bool, leader_leo: int, now_ms: int
) -> FollowerFetchState:
    """Leader side: what a leader that leads on into its next leader epoch (its log
    untouched, no other leader in between) keeps of a follower (Kafka's
    Replica.resetReplicaState for a re-elected leader).

    The follower's position and broker epoch stay: it still holds those records of this
    very log, so the high watermark need not wait for a fetch in the new epoch. An ISR
    member counts as caught up and as having fetched as of now; any other replica must
    prove itself with fetches of the new epoch.
    """
    return FollowerFetchState(
        broker_epoch=prev.broker_epoch,
        fetch_offset=prev.fetch_offset,
        last_fetch_ms=now_ms if in_isr and prev.fetch_offset is not None else None,
        leader_leo_at_fetch=leader_leo,
        last_caught_up_ms=now_ms if in_isr else None,
        caught_up=in_isr and prev.caught_up,
    )


def next_high_watermark(
    *,
    current_hw: int,
    leader_id: int,
    leader_leo: int,
    isr: Iterable[int],
    min_isr: int,
    follower_offsets: Mapping[int, int | None],
    pending_isr: Iterable[int] = (),
) -> int:
    """Leader side: the high watermark, never lower than `current_hw`.

    It is the smallest LEO among the ISR members (ours, and each follower's last fetch
    offset); members of an ISR change still in flight count too (Kafka's maximal ISR).
    KIP-966: it does not move while the committed ISR is smaller than `min_isr`, nor
    while an ISR member has not fetched yet in this leader epoch.
    """
    committed = frozenset(isr)
    if len(committed) < min_isr:
        return current_hw
    low = leader_leo
    for member in committed | frozenset(pending_isr):
        if member == leader_id:
            continue
        offset = follower_offsets.get(member)
        if offset is None:
            return current_hw
        low = min(low, offset)
    return max(current_hw, low)


def join_floor(high_watermark: int, history: Sequence[EpochEntry], leader_epoch: int) -> int:
    """The offset a follower's log must reach before it may join the ISR: the leader's
    high watermark and the start of the leader's current epoch (Kafka's
    Partition.isFollowerInSync). Being caught up at its last fetch is not enough: a
    follower cut off right after that fetch would join while missing records acknowledged
    since, and a clean election could then lose them silently (found by
    `metactl simulate faults`)."""
    start = next((s for e, s in history if e == leader_epoch), 0)
    return max(high_watermark, start)


def isr_change(
    *,
    leader_id: int,
    isr: frozenset[int],
    replicas: Sequence[int],
    followers: Mapping[int, FollowerFetchState],
    active_epochs: Mapping[int, int],
    now_ms: int,
    lag_max_ms: int,
    join_floor: int,
) -> frozenset[int] | None:
    """Leader side: the ISR to propose, or None when it should stay as it is.

    Shrink: a follower in the ISR that has not been caught up for `lag_max_ms`, or that
    is no longer an active broker. Expand: a replica outside the ISR whose latest fetch,
    at its current broker epoch (`active_epochs` maps each unfenced, not-shutting-down
    broker to its epoch), showed it caught up, which has been caught up within
    `lag_max_ms` (so that the next check does not shrink it straight away), and whose
    fetch offset reaches `join_floor` (see `join_floor`). The leader always stays in.
    Applying the result and asking again gives None.
    """

    def in_sync(st: FollowerFetchState | None) -> bool:
        return (
            st is not None
            and st.last_caught_up_ms is not None
            and now_ms - st.last_caught_up_ms <= lag_max_ms
        )

    new = {leader_id}
    for r in isr:
        if r == leader_id or r not in active_epochs:
            continue
        st = followers.get(r)
        if st is not None and st.last_caught_up_ms is not None and not in_sync(st):
            continue  # lagging: shrink
        new.add(r)
    for r in replicas:
        if r in isr or r == leader_id:
            continue
        st = followers.get(r)
        if (
            st is None
            or not st.caught_up
            or not in_sync(st)  # else the next check would shrink it again
            or st.broker_epoch is None
            or active_epochs.get(r) != st.broker_epoch
            or st.fetch_offset is None
            or st.fetch_offset < join_floor
        ):
            continue
        new.add(r)
    proposal = frozenset(new)
    return None if proposal == isr else proposal
