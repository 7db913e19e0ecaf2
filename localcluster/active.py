"""Who is active: `cluster up`'s line at each new term of its controller quorum on etcd,
"controller 3 is active now (term 1234); controller 2 lost it (dead-active detection)".

Each controller that becomes active writes a ControllerChangeRecord as its term's first
record (`controller.core.controller_change`); `ActiveWatch` follows the committed log
for them, as a broker tails it: FetchMetadata long polls from any controller of the
quorum (standbys serve it too; a failed one is left for the next, from the same
offset), so it hears of a new term once its record is committed, with `--no-events` as
well as with the feed. Once it has caught up with the log it says who is active then,
and after that each change.

It reads and prints only: it decides nothing, and starts or stops no process.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Collection
from typing import Final

from clients.controller import Security, ask
from metactl.errors import MetactlError
from metadata_image.transactions import EffectiveEntries
from metadata_log.records import ControllerChangeRecord
from protocol.messages.broker_controller import (
    FetchedRecord,
    FetchMetadataRequest,
    FetchMetadataResponse,
)

__all__ = ["ActiveWatch", "active_text", "numbered"]

WAIT_MS: Final = 5_000  # the long poll (the controller caps it at 10 s)
READ_RECORDS: Final = 10_000
TIMEOUT_S: Final = 10.0  # one answer, failovers ridden meanwhile
RETRY_S: Final = 1.0  # after a fetch failed on every controller: a backoff, not a poll


def active_text(r: ControllerChangeRecord, name: Callable[[str], str], *, now: bool) -> str:
    """The line of a new term (`now`): "controller 3 is active now (term 1234);
    controller 2 lost it (dead-active detection)"; else who is active, "controller 1 is
    active (term 17)". `name` names the nodes (e.g. "c3" -> "controller 3")."""
    text = f"{name(r.node)} is active{' now' if now else ''} (term {r.term})"
    if not now or not r.previous_node:
        return text
    why = r.previous_reason or "ended"
    if r.previous_detail:
        why += f": {r.previous_detail}"
    return f"{text}; {name(r.previous_node)} lost it ({why})"


def numbered(numbers: Callable[[], Collection[int]]) -> Callable[[str], str]:
    """Names a node "cN" that `cluster up` runs as "controller N" (N in `numbers()`)."""

    def name(node: str) -> str:
        m = re.fullmatch(r"c(\d+)", node)
        if m is not None and int(m.group(1)) in numbers():
            return f"controller {int(m.group(1))}"
        return f"controller {node}"

    return name


class ActiveWatch:
    """Follows a quorum's committed log for its ControllerChangeRecords, and `say`s a
    line for each (`active_text`)."""

    def __init__(
        self,
        bootstrap: Callable[[], str],
        security: Security,
        name: Callable[[str], str],
        say: Callable[[str], None],
    ) -> None:
        self.bootstrap = bootstrap  # every controller's address, as now recorded
        self.security = security
        self.name = name
        self.say = say
        self.offset = 0
        self.latest: ControllerChangeRecord | None = None  # the last term's, read so far
        self.caught_up = False
        self._effective = EffectiveEntries[FetchedRecord]()  # holds an open transaction

    async def run(self) -> None:
        """Until cancelled; a fetch that fails on every controller is tried again after
        `RETRY_S` (a cluster whose controllers are all down, being restarted)."""
        while True:
            try:
                async with self.security.controller_client(self.bootstrap()) as client:
                    while True:
                        request = FetchMetadataRequest(
                            from_offset=self.offset,
                            max_records=READ_RECORDS,
                            max_wait_ms=WAIT_MS if self.caught_up else 0,
                        )
                        r = await ask(client, request, TIMEOUT_S + WAIT_MS / 1000)
                        if not isinstance(r, FetchMetadataResponse):
                            raise MetactlError(f"unexpected answer {type(r).__name__}")
                        self.take(r)
            except MetactlError:
                await asyncio.sleep(RETRY_S)

    def take(self, r: FetchMetadataResponse) -> None:
        """One answer: its records that take effect, and whether the log is read to its
        end (who is active is said then, once)."""
        if r.snapshot is not None:  # a truncated log: its snapshot holds no term
            self.offset = r.snapshot.offset
            self._effective = EffectiveEntries[FetchedRecord]()
            return
        if r.records:
            self.offset = r.records[-1].offset + 1
        for e in self._effective.add(r.records):
            if isinstance(e.record, ControllerChangeRecord):
                self.latest = e.record
                if self.caught_up:
                    self.say(active_text(e.record, self.name, now=True))
        if not self.caught_up and self.offset >= r.end_offset:
            self.caught_up = True
            if self.latest is not None:
                self.say(active_text(self.latest, self.name, now=False))
