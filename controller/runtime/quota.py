"""Admission limits for mutating operator requests: KIP-599's controller mutation quota
and a cap on the partitions one request may create.

Owns the per-principal token buckets and their arithmetic, and the count of partitions a
CreateTopics request asks for. Time comes only from the injected clock, so tests move it.
Must not decide anything about metadata (the core does), do IO, or answer requests (the
service turns these errors into answers, before anything is submitted).

The quota is Kafka's token bucket (KIP-599, `controller_mutation_rate`): a bucket per
principal holds up to `rate * burst_window_s` partitions and refills at `rate` per
second. A request is accepted while its principal's bucket is not negative, and is then
charged in full, so one large request passes and drives the bucket negative; the
principal's next request is refused with THROTTLING_QUOTA_EXCEEDED and the time until
the bucket is back at zero. Tokens are counted in thousandths of a partition, so the
arithmetic is exact in integers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import structlog

from controller.runtime.clock import Clock
from metactl.errors import (
    InvalidConfigurationError,
    PolicyViolationError,
    ThrottlingQuotaExceededError,
)
from protocol.messages.admin import CreateTopic

log = structlog.get_logger("metactl.controller.quota")

# Partitions created or changed per second per principal. Creating a partition costs the
# controller 9-18 µs, commit included (bench/controller_ops.py on a loaded 2-core machine:
# 100,000 in 0.89 s, 10,000 in 0.18 s), so one principal at the limit takes 1-2% of its
# time and adds at most ~1,000 records a second to the log every broker replays; no
# operator or deployment script creating topics of up to thousands of partitions notices
# it. Kafka has no default (unlimited); 0 turns it off.
DEFAULT_MUTATION_RATE: Final = 1000
# The bucket holds `rate * window` partitions: a burst of 10 s worth (Kafka's
# quota.window.num * quota.window.size.seconds is 11 s), i.e. one maximal request.
DEFAULT_BURST_WINDOW_S: Final = 10
# One CreateTopics is one controller event and one durable batch: 10,000 partitions took
# 0.18 s (above), well inside a heartbeat interval (2 s), where 100,000 hold everything
# else up for about a second; their answer (assignments) stays far below the frame
# limit. Kafka has no such cap; raise it for topics of more partitions.
DEFAULT_MAX_PARTITIONS_PER_REQUEST: Final = 10_000

_MILLI: Final = 1000
# Past this many buckets, those that have refilled completely (the same as none) go.
_SWEEP_AT: Final = 1024
_LOG_PERIOD_MS: Final = 1000


@dataclass(frozen=True)
class MutationLimits:
    """`rate` partitions/s per principal (0: no quota), its burst window, and the most
    partitions one CreateTopics may create in all."""

    rate: int = DEFAULT_MUTATION_RATE
    burst_window_s: int = DEFAULT_BURST_WINDOW_S
    max_partitions_per_request: int = DEFAULT_MAX_PARTITIONS_PER_REQUEST

    def __post_init__(self) -> None:
        if self.rate < 0 or self.burst_window_s < 1 or self.max_partitions_per_request < 1:
            raise InvalidConfigurationError(
                f"invalid mutation limits: rate {self.rate} (>= 0), burst window "
                f"{self.burst_window_s} s (>= 1), max partitions per request "
                f"{self.max_partitions_per_request} (>= 1)"
            )

    def check_request(self, partitions: int) -> None:
        """POLICY_VIOLATION if one request asks for more partitions than the cap."""
        if partitions > self.max_partitions_per_request:
            raise PolicyViolationError(
                f"the request creates {partitions} partitions; at most "
                f"{self.max_partitions_per_request} per request "
                "(--max-partitions-per-request)"
            )


def requested_partitions(spec: CreateTopic, default_partitions: int) -> int:
    """The partitions a CreateTopic would create (the core validates the numbers)."""
    if spec.assignments is not None:
        return len(spec.assignments)
    return max(0, spec.partitions if spec.partitions is not None else default_partitions)


class _Bucket:
    __slots__ = ("at_ms", "tokens")

    def __init__(self, tokens: int, at_ms: int) -> None:
        self.tokens = tokens  # thousandths of a partition; negative: in debt
        self.at_ms = at_ms


class MutationQuota:
    """Per-principal token buckets. `acquire` before submitting, `release` if nothing
    was changed after all (the core refused), so only real mutations are charged."""

    def __init__(self, rate: int, burst_window_s: int, clock: Clock) -> None:
        self.rate = rate  # partitions/s = thousandths of a partition per ms
        self.capacity = rate * burst_window_s * _MILLI
        self.clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._logged_ms: dict[str, int] = {}
        self.throttled_total = 0
        # Called with (principal, throttle_ms) on every refusal (tests await these).
        self.listeners: list[Callable[[str, int], None]] = []

    @classmethod
    def of(cls, limits: MutationLimits, clock: Clock) -> MutationQuota:
        return cls(limits.rate, limits.burst_window_s, clock)

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def tokens(self, principal: str) -> float:
        """The principal's bucket now, in partitions (full when it has none)."""
        b = self._buckets.get(principal)
        return (self.capacity if b is None else self._refill(b, self.clock.now_ms())) / _MILLI

    def throttle_ms(self, principal: str) -> int:
        """How long until the principal's bucket is back at zero (0: not throttled)."""
        if not self.enabled:
            return 0
        b = self._buckets.get(principal)
        tokens = self.capacity if b is None else self._refill(b, self.clock.now_ms())
        return 0 if tokens >= 0 else -(tokens // self.rate)  # ceil(-tokens / rate)

    def acquire(self, principal: str, partitions: int) -> None:
        """Charge `partitions` to the principal, or raise ThrottlingQuotaExceededError
        (with the time to wait) if its bucket is negative; nothing is charged then."""
        if not self.enabled:
            return
        now = self.clock.now_ms()
        b = self._buckets.get(principal)
        if b is None:
            if len(self._buckets) >= _SWEEP_AT:
                self._sweep(now)
            b = self._buckets[principal] = _Bucket(self.capacity, now)
        tokens = self._refill(b, now)
        if tokens < 0:
            wait_ms = -(tokens // self.rate)
            self._throttled(principal, wait_ms, now)
            raise ThrottlingQuotaExceededError(
                f"controller mutation quota of {self.rate} partitions/s exceeded for "
                f"{principal}: retry after {wait_ms} ms",
                retry_after_ms=wait_ms,
            )
        b.tokens = tokens - partitions * _MILLI

    def release(self, principal: str, partitions: int) -> None:
        """Give back what `acquire` charged for a request that changed nothing."""
        b = self._buckets.get(principal)
        if b is not None:
            b.tokens = min(
                self.capacity, self._refill(b, self.clock.now_ms()) + partitions * _MILLI
            )

    def _refill(self, b: _Bucket, now: int) -> int:
        if now > b.at_ms:
            b.tokens = min(self.capacity, b.tokens + (now - b.at_ms) * self.rate)
            b.at_ms = now
        return b.tokens

    def _sweep(self, now: int) -> None:
        full = [k for k, b in self._buckets.items() if self._refill(b, now) >= self.capacity]
        for k in full:
            del self._buckets[k]
            self._logged_ms.pop(k, None)

    def _throttled(self, principal: str, wait_ms: int, now: int) -> None:
        self.throttled_total += 1
        for listener in self.listeners:
            listener(principal, wait_ms)
        last = self._logged_ms.get(principal)
        if last is None or now - last >= _LOG_PERIOD_MS:  # at most a line a second each
            self._logged_ms[principal] = now
            log.info("controller mutation throttled", principal=principal, throttle_ms=wait_ms)
