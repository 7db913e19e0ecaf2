"""The admission policy of the controller's requests: who may ask, and how much.

Every listener admits a request here before any API handler sees it
(`RequestAdmission.admit`): under TLS, `controller.core.authz` decides whether the
peer's principal may make it (for a broker's Envelope, the broker may forward and its
client may make the inner request), and a refusal is counted
(`metactl_authorization_failures_total`, while active) and logged at most once per
principal per `refusal_log_period_ms` (the next line's `count` includes the refusals
held back, so an attacker cannot flood the log). Without TLS (`--insecure`) there is no
principal to check. The API handlers then charge the writes that create or move
partitions to the per-principal mutation quota and the partitions-per-request cap held
here (KIP-599, `controller.runtime.quota`), a topic at a time; the item caps and answer
bounds of each API are `controller.runtime.request_caps`.

Must not: submit anything, decide metadata, or read the log.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from controller.core.authz import AUTHORIZATION_ERRORS, authorize, operation_of
from controller.runtime.clock import Clock
from controller.runtime.metrics import ControllerMetrics
from controller.runtime.quota import MutationLimits, MutationQuota
from metactl.errors import MetactlError
from protocol.admission import Peer
from protocol.messages.admin import Envelope
from protocol.messages.unions import Message
from protocol.tls import broker_id_of

__all__ = ["RequestAdmission", "enveloped_peer"]

log = structlog.get_logger("metactl.controller.service")


def enveloped_peer(envelope: Envelope, broker: Peer) -> Peer:
    """Who sent an envelope's inner request: its client (the principal the broker
    authenticated, and the client's address; the broker's if it named none)."""
    return Peer(address=envelope.client_address or broker.address, principal=envelope.principal)


class RequestAdmission:
    """Authorization (with its refusals counted and logged), and the mutation quota and
    partitions-per-request cap the API handlers charge."""

    def __init__(
        self,
        *,
        authorizing: bool,
        clock: Clock,
        mutation_limits: MutationLimits,
        metrics: Callable[[], ControllerMetrics | None],
    ) -> None:
        self.authorizing = authorizing  # TLS: principals to check
        self.clock = clock
        # KIP-599 controller mutation quota per principal, and the partitions-per-request
        # cap (controller/runtime/quota.py), for CreateTopics and ElectLeaders.
        self.mutation_limits = mutation_limits
        self.quota = MutationQuota.of(mutation_limits, clock)
        self._metrics = metrics  # the active term's (a standby logs refusals only)
        # Authorization refusals are logged at most once per principal per period (the
        # counter has every one): principal -> (ms of its last line, refusals held since).
        self.refusal_log_period_ms = 1000
        self._refusal_lines: dict[str, tuple[int, int]] = {}

    def admit(self, body: Message, peer: Peer) -> None:
        """Raise the authorization error if `peer` may not make this request (before
        anything is submitted)."""
        if not self.authorizing:
            return
        try:
            authorize(peer.principal, body)
        except AUTHORIZATION_ERRORS as exc:
            if isinstance(body, Envelope) and broker_id_of(peer.principal) is not None:
                # A broker's envelope refused for its client: the client's refusal.
                self._refused(enveloped_peer(body, peer), operation_of(body.request), exc)
            else:
                self._refused(peer, operation_of(body), exc)
            raise

    def _refused(self, peer: Peer, operation: str, exc: MetactlError) -> None:
        """Count an authorization refusal, and log it unless this principal already had
        a line within `refusal_log_period_ms` (an attacker cannot flood the log; the
        next line's `count` includes the refusals held back)."""
        principal = peer.principal if peer.principal is not None else "-"
        metrics = self._metrics()
        if metrics is not None:  # a standby logs refusals only
            metrics.authorization_failures.labels(principal=principal, operation=operation).inc()
        now = self.clock.now_ms()
        last = self._refusal_lines.get(principal)
        if last is not None and now - last[0] < self.refusal_log_period_ms:
            self._refusal_lines[principal] = (last[0], last[1] + 1)
            return
        self._refusal_lines[principal] = (now, 0)
        log.warning(
            "authorization failed",
            principal=principal,
            operation=operation,
            code=exc.code,
            peer=peer.address,
            error=exc.message,
            count=1 + (last[1] if last is not None else 0),
        )
