"""Broker sessions: when each broker last heartbeated, and who has expired.

Soft state of the controller service (never logged). After a controller restart every
registered broker gets a full session timeout of grace before it can expire.
"""

from __future__ import annotations


class BrokerSessions:
    def __init__(self, timeout_ms: int) -> None:
        self.timeout_ms = timeout_ms
        self._last: dict[int, int] = {}

    def touch(self, broker_id: int, now_ms: int) -> None:
        self._last[broker_id] = now_ms

    def forget(self, broker_id: int) -> None:
        self._last.pop(broker_id, None)

    def last_heartbeat_ms(self, broker_id: int) -> int | None:
        return self._last.get(broker_id)

    def expired(self, candidates: list[int], now_ms: int) -> list[int]:
        """Brokers among `candidates` whose last heartbeat is older than the timeout.

        A candidate never seen (e.g. just after a controller restart) starts its session now.
        """
        out = []
        for b in candidates:
            last = self._last.setdefault(b, now_ms)
            if now_ms - last > self.timeout_ms:
                out.append(b)
        return out
