"""The controller mutation quota (controller/runtime/quota.py) on a virtual clock: Kafka's
token bucket (accept while not negative, charge in full, refuse with the exact time until
the bucket is back at zero), refunds, one bucket per principal, and the request cap."""

from __future__ import annotations

import pytest

from controller.runtime.clock import VirtualClock
from controller.runtime.quota import (
    _SWEEP_AT,
    MutationLimits,
    MutationQuota,
    requested_partitions,
)
from metactl.errors import (
    InvalidConfigurationError,
    PolicyViolationError,
    ThrottlingQuotaExceededError,
)
from protocol.messages.admin import CreateTopic
from protocol.messages.base import ErrorResponse, error_response


def quota(
    rate: int = 100, window_s: int = 1, start_ms: int = 1_000
) -> tuple[MutationQuota, VirtualClock]:
    clock = VirtualClock(start_ms)
    return MutationQuota(rate, window_s, clock), clock


def refused_ms(q: MutationQuota, principal: str, partitions: int = 1) -> int:
    with pytest.raises(ThrottlingQuotaExceededError) as e:
        q.acquire(principal, partitions)
    assert e.value.retriable and e.value.code == "THROTTLING_QUOTA_EXCEEDED"
    assert f"retry after {e.value.retry_after_ms} ms" in e.value.message
    return e.value.retry_after_ms


def test_one_big_request_passes_then_the_next_waits_until_the_bucket_is_back_at_zero() -> None:
    q, clock = quota(rate=100, window_s=1)  # holds 100 partitions, refills 100/s
    q.acquire("alice", 150)  # accepted from a full bucket, charged in full: -50
    assert q.tokens("alice") == -50
    assert refused_ms(q, "alice") == 500  # 50 partitions at 100/s
    assert q.tokens("alice") == -50  # a refusal charges nothing
    clock.set(clock.now_ms() + 499)
    assert refused_ms(q, "alice") == 1  # still 0.1 partition short
    clock.set(clock.now_ms() + 1)
    q.acquire("alice", 1)  # exactly zero is not negative
    assert q.tokens("alice") == -1


def test_the_throttle_time_rounds_up_so_waiting_it_is_always_enough() -> None:
    q, clock = quota(rate=3, window_s=1)
    q.acquire("a", 4)  # 3 - 4 = -1 partition: 333.3 ms at 3/s
    wait = refused_ms(q, "a")
    assert wait == 334
    clock.set(clock.now_ms() + wait)
    q.acquire("a", 1)


def test_the_bucket_refills_up_to_the_burst_window_only() -> None:
    q, clock = quota(rate=10, window_s=5)
    assert q.tokens("a") == 50  # a principal never seen has a full bucket
    q.acquire("a", 50)
    assert q.tokens("a") == 0
    clock.set(clock.now_ms() + 3_600_000)  # an hour idle
    assert q.tokens("a") == 50
    q.acquire("a", 120)
    assert refused_ms(q, "a") == 7_000  # 70 partitions at 10/s


def test_each_principal_has_its_own_bucket() -> None:
    q, _ = quota()
    q.acquire("alice", 1000)
    refused_ms(q, "alice")
    q.acquire("bob", 1)  # bob is not throttled for alice
    assert q.throttle_ms("bob") == 0 and q.throttle_ms("alice") > 0


def test_a_release_gives_back_what_was_charged_up_to_a_full_bucket() -> None:
    q, _ = quota(rate=100, window_s=1)
    q.acquire("a", 150)
    q.release("a", 150)  # the core refused: nothing was created
    assert q.tokens("a") == 100
    q.release("a", 10)
    assert q.tokens("a") == 100
    q.release("nobody", 5)  # no bucket: nothing to give back
    assert q.tokens("nobody") == 100


def test_rate_zero_is_no_quota() -> None:
    q, _ = quota(rate=0)
    for _ in range(3):
        q.acquire("a", 10**9)
    assert not q.enabled and q.throttle_ms("a") == 0 and q.throttled_total == 0


def test_refusals_are_counted_and_reported_to_listeners() -> None:
    q, _ = quota(rate=10, window_s=1)
    seen: list[tuple[str, int]] = []
    q.listeners.append(lambda principal, ms: seen.append((principal, ms)))
    q.acquire("a", 20)
    refused_ms(q, "a")
    refused_ms(q, "a")
    assert seen == [("a", 1000), ("a", 1000)] and q.throttled_total == 2


def test_buckets_back_to_full_are_forgotten_so_principals_cannot_grow_memory() -> None:
    q, clock = quota(rate=1000, window_s=1)
    for i in range(_SWEEP_AT):
        q.acquire(f"p{i}", 1)
    q.acquire("debtor", 5000)
    clock.set(clock.now_ms() + 10)  # the 1-partition buckets refill; the debtor's does not
    q.acquire("newcomer", 1)  # over the threshold: a sweep first
    assert len(q._buckets) == 2  # the debtor and the newcomer
    assert q.throttle_ms("debtor") > 0  # a bucket in debt is never forgotten


def test_the_throttle_time_travels_in_the_error_response() -> None:
    r = error_response(ThrottlingQuotaExceededError("slow down", retry_after_ms=250))
    assert r == ErrorResponse(
        code="THROTTLING_QUOTA_EXCEEDED", message="slow down", retriable=True, throttle_time_ms=250
    )
    # Omitted when 0, so other errors are unchanged on the wire.
    assert error_response(PolicyViolationError("no")).throttle_time_ms == 0


def test_the_request_cap_and_the_partitions_a_request_asks_for() -> None:
    limits = MutationLimits(max_partitions_per_request=100)
    limits.check_request(100)
    with pytest.raises(PolicyViolationError) as e:
        limits.check_request(101)
    assert not e.value.retriable and "at most 100" in e.value.message
    assert requested_partitions(CreateTopic(name="t", partitions=7), 1) == 7
    assert requested_partitions(CreateTopic(name="t"), 3) == 3  # the cluster default
    assert requested_partitions(CreateTopic(name="t", assignments=[[1], [2]]), 3) == 2
    assert requested_partitions(CreateTopic(name="t", partitions=-5), 3) == 0  # the core refuses


@pytest.mark.parametrize(
    "bad",
    [
        {"rate": -1},
        {"burst_window_s": 0},
        {"max_partitions_per_request": 0},
    ],
)
def test_limits_out_of_range_are_a_configuration_error(bad: dict[str, int]) -> None:
    with pytest.raises(InvalidConfigurationError):
        MutationLimits(**bad)
