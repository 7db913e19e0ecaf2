"""Which member of an etcd cluster a call goes to, and what happens when it does not
answer (`Members`): retries and hedging.

The library balances round-robin over one channel, so a third of the calls would go to a
member that is frozen (SIGSTOP, a stalled machine: its TCP connections stay open and look
healthy) or is a follower of a dead leader, and wait out their deadline. Here every call
goes first to the member that answered last (`member`), then to those that answered
since they last failed:

- an idempotent call (reads, lease grant and revoke, the member list, and the
  transactions that may be applied twice) is *hedged* (`hedged`): with no answer from
  that member after `HEDGE_S` (the caller may give longer, as for a read of a page of
  values) it is also sent to the next member, and after a failure to the next at once;
  the first answer wins and its member serves the next calls. A member that answered
  with etcd's own transient error (no leader, leader changed: an election) is asked
  again after `RETRY_BACKOFF_S`. The call fails when no member can be reached (the last
  error: a cluster that is down fails at once) or at its deadline;
- a call that must not be repeated blindly (a transaction) is sent once (`once`), to
  that member, within its deadline: an error or no answer means its outcome is unknown,
  and moves later calls to the next member, so the caller's retry of it goes elsewhere.

Owns the members' clients and their answer times; knows no etcd call (the caller passes
`attempt`, `metadata_log.etcd.client`) and no key of the log.
"""

from __future__ import annotations

import asyncio
import time
from asyncio import FIRST_COMPLETED
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar

import grpc.aio
from etcd3aio import Etcd3Client, EtcdError

from metactl.errors import MetactlError, StoreUnavailableError
from metadata_log.etcd.errors import answered_busy, mapped
from metadata_log.etcd.target import EtcdTarget

HEDGE_S: Final = 0.25
"""An idempotent call unanswered this long by its member is also sent to the next one."""
RETRY_BACKOFF_S: Final = 0.05
"""A call that asks members again after every one failed pauses this long first."""

T = TypeVar("T")


class Members:
    """The clients of an etcd cluster's members, one channel each, in endpoint order, and
    which of them calls go to first (the module's docstring)."""

    def __init__(
        self, target: EtcdTarget, members: Sequence[Etcd3Client], timeout_s: float
    ) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.clients = list(members)  # one client (one channel) per endpoint, in order
        self.current = 0  # the member calls go to first
        # When each member last answered, and last failed or did not answer in time.
        self._ok = [0.0] * len(self.clients)
        self._bad = [0.0] * len(self.clients)
        self._closed = False

    @property
    def where(self) -> str:
        return ",".join(self.target.endpoints)

    @property
    def member(self) -> str:
        """The endpoint calls go to first now: the member that answered last."""
        return self.target.endpoints[self.current]

    def order(self) -> list[int]:
        """The members in the order a call tries them: the one that answered last, then
        those that answered since they last failed (most recent first), then the rest
        (failed longest ago first); ties in endpoint order after it."""
        n = len(self.clients)
        rest = [(self.current + k) % n for k in range(1, n)]
        rest.sort(
            key=lambda i: (0, -self._ok[i]) if self._ok[i] >= self._bad[i] else (1, self._bad[i])
        )
        return [self.current, *rest]

    def answered(self, i: int) -> None:
        self._ok[i] = time.monotonic()
        self.current = i

    def failed(self, i: int) -> None:
        """Member `i` failed or did not answer in time: later calls go to another (the
        next in `order`), unless one moved on already."""
        self._bad[i] = time.monotonic()
        if self.current == i:
            self.current = self.order()[1] if len(self.clients) > 1 else i

    def service(self, client: Etcd3Client, name: str) -> Any:
        service = getattr(client, name)
        if service is None or self._closed:  # closed meanwhile (a controller stopping)
            raise StoreUnavailableError("the etcd client is closed")
        return service

    def error(self, exc: BaseException, what: str) -> MetactlError:
        if isinstance(exc, MetactlError):
            return exc
        if isinstance(exc, (EtcdError, grpc.aio.AioRpcError)):
            return mapped(exc, what, self.where)
        raise exc

    def timed_out(self, what: str, timeout_s: float, last: MetactlError | None) -> MetactlError:
        after = f"; last error: {last.message}" if last is not None else ""
        return StoreUnavailableError(
            f"etcd at {self.where} did not answer {what} within {timeout_s:g} s "
            f"(members down or no quorum){after}"
        )

    async def hedged(
        self,
        what: str,
        attempt: Callable[[Etcd3Client], Awaitable[T]],
        timeout_s: float | None = None,
        hedge_s: float = HEDGE_S,
        *,
        persist: bool = False,
    ) -> T:
        """An idempotent call: to the member that answered last; also to the next one
        (`order`) when it has not answered after `hedge_s`, or at once when it failed.
        The first answer wins (its member serves the next calls). A member that failed
        but answered (etcd said "leader changed", "no leader"...: an election) is asked
        again after `RETRY_BACKOFF_S`; one that could not be reached is not, unless
        `persist`. Every member unreachable is the last error; no answer within
        `timeout_s`, StoreUnavailableError. Members that had not answered when the call
        ended count as failed."""
        total = self.timeout_s if timeout_s is None else timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + total
        pending: dict[asyncio.Future[T], int] = {}
        tried: set[int] = set()
        again_at: dict[int, float] = {}  # failed members to ask again, and when
        last: MetactlError | None = None
        hedge_at = loop.time()  # when the next member not yet asked may be
        try:
            while True:
                now = loop.time()
                if now >= deadline:
                    raise self.timed_out(what, total, last)
                order = self.order()
                fresh = [i for i in order if i not in tried]
                due = [i for i in order if again_at.get(i, deadline) <= now]
                if fresh and now >= hedge_at:
                    i = fresh[0]
                    hedge_at = now + hedge_s
                elif due:
                    i = due[0]
                    del again_at[i]
                else:
                    i = -1
                if i >= 0:
                    tried.add(i)
                    pending[asyncio.ensure_future(attempt(self.clients[i]))] = i
                    continue
                if not pending and not fresh and not again_at:
                    assert last is not None  # every member failed and none will be asked
                    raise last
                wake = min([deadline, *again_at.values(), *([hedge_at] if fresh else [])])
                if not pending:
                    await asyncio.sleep(max(0.0, wake - now))
                    continue
                done, _ = await asyncio.wait(
                    pending, timeout=max(0.0, wake - now), return_when=FIRST_COMPLETED
                )
                for fut in done:
                    i = pending.pop(fut)
                    exc = fut.exception()
                    if exc is None:
                        self.answered(i)
                        return fut.result()
                    last = self.error(exc, what)
                    if not isinstance(last, StoreUnavailableError):
                        raise last
                    self.failed(i)
                    if persist or answered_busy(last):
                        again_at[i] = loop.time() + RETRY_BACKOFF_S
                    hedge_at = min(hedge_at, loop.time())  # the next member at once
        finally:
            for fut, i in pending.items():
                fut.cancel()
                self.failed(i)
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)

    async def once(
        self, what: str, attempt: Callable[[Etcd3Client], Awaitable[T]], timeout_s: float
    ) -> T:
        """A call that must not be repeated blindly: once, to the member that answered
        last, within `timeout_s`; an error or no answer moves later calls to another."""
        i = self.current
        try:
            async with asyncio.timeout(timeout_s):
                result = await attempt(self.clients[i])
        except TimeoutError:
            self.failed(i)
            raise self.timed_out(what, timeout_s, None) from None
        except Exception as exc:
            error = self.error(exc, what)
            if isinstance(error, StoreUnavailableError):
                self.failed(i)
            raise error from None
        self._ok[i] = time.monotonic()
        return result

    async def close(self) -> None:
        self._closed = True
        for client in self.clients:
            await client.close()
