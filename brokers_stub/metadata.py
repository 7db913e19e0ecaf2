"""The broker's metadata image: tail the controller's committed log into a ClusterImage.

Long-polls FetchMetadata from the controller, rebuilds the image from a snapshot when
the controller answers with one, replays records with `metadata_image.transactions`
(records of a transaction are held until its end marker and applied together; an
aborted one never is), writes the applied offset to `metadata_offset` (page cache) and
reports every new image with its `MetadataDelta` to its listeners, saying whether it is
caught up with the committed end offset the controller last reported. Fetches continue
after the records held, so the image can stay behind the fetch position while a large
transaction streams in. A start always fetches from offset 0.

This module owns the image and the fetch loop. It must not act on the image (the
replica manager does) and never writes metadata: it only follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable
from pathlib import Path

from brokers_stub.logctx import BrokerLog
from brokers_stub.storage import write_metadata_offset
from metactl.errors import (
    MetactlError,
    MetadataGapError,
    NetworkError,
    OffsetOutOfRangeError,
    ReplayError,
)
from metadata_image.delta import MetadataDelta
from metadata_image.image import ClusterImage
from metadata_image.snapshot import image_from_records
from metadata_image.transactions import LogReplay, apply_log
from protocol.client import RpcClient
from protocol.messages.broker_controller import FetchMetadataRequest, FetchMetadataResponse

# listener(image, delta, caught_up); delta None: the image was replaced (a snapshot, or a
# reset), so everything may have changed.
ImageListener = Callable[[ClusterImage, MetadataDelta | None, bool], None]


def apply_fetch(
    state: LogReplay, resp: FetchMetadataResponse
) -> tuple[LogReplay, MetadataDelta | None]:
    """Where the follower stands after one fetch response, and what took effect (pure).

    A snapshot replaces the image (the delta is then None: everything may have changed);
    records below the fetch position are skipped (a resend), a record beyond it means
    something was missed and raises `MetadataGapError`. Records of an open transaction
    are held in the state; the delta names what took effect.
    """
    replaced = resp.snapshot is not None
    if resp.snapshot is not None:
        state = LogReplay(image_from_records(resp.snapshot.records, resp.snapshot.offset))
    position = state.next_offset
    fresh = [r for r in resp.records if r.offset >= position]
    if fresh and fresh[0].offset != position:
        raise MetadataGapError(
            f"fetched records start at {fresh[0].offset}, the follower is at {position}"
        )
    for prev, nxt in itertools.pairwise(fresh):
        if nxt.offset != prev.offset + 1:
            raise MetadataGapError(f"fetched records jump from {prev.offset} to {nxt.offset}")
    if not fresh:
        return state, None if replaced else MetadataDelta()
    state, delta = apply_log(state, [r.record for r in fresh])
    return state, None if replaced else delta


class MetadataFollower:
    def __init__(
        self,
        client: RpcClient,
        data_dir: Path,
        log: BrokerLog,
        *,
        max_wait_ms: int,
        request_timeout_ms: int,
    ) -> None:
        self.client = client
        self.data_dir = data_dir
        self.log = log
        self.max_wait_ms = max_wait_ms
        self.request_timeout_ms = request_timeout_ms
        self.state = LogReplay()  # the image, and a transaction being held
        self.controller_end_offset: int | None = None
        # When the broker first saw committed records it had not applied (None: caught up).
        self.lagging_since: float | None = None
        self.listeners: list[ImageListener] = []
        self.updated = asyncio.Event()  # set after every applied response (for observers)
        self._replaced = True  # the next listener call reports a whole new image

    @property
    def image(self) -> ClusterImage:
        """The applied image: at a transaction boundary, never part of a transaction."""
        return self.state.image

    @property
    def applied_offset(self) -> int:
        """The offset of the next record needed; every record below it is applied."""
        return self.image.end_offset

    def lag(self) -> tuple[int, float]:
        """Metadata lag: committed records not yet applied, and for how long (seconds)."""
        end = self.controller_end_offset
        records = 0 if end is None else max(0, end - self.image.end_offset)
        since = self.lagging_since
        return records, 0.0 if since is None or records == 0 else time.monotonic() - since

    @property
    def caught_up(self) -> bool:
        """Applied up to the committed end the controller last reported."""
        end = self.controller_end_offset
        return end is not None and self.image.end_offset >= end

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                resp = await self.client.request(
                    FetchMetadataRequest(
                        from_offset=self.state.next_offset, max_wait_ms=self.max_wait_ms
                    ),
                    timeout_s=(self.max_wait_ms + self.request_timeout_ms) / 1000,
                )
                if not isinstance(resp, FetchMetadataResponse):
                    raise MetadataGapError(f"unexpected {type(resp).__name__}")
                self._apply(resp)
                failures = 0
            except OffsetOutOfRangeError as exc:
                # The controller's log no longer matches ours (e.g. it lost its data
                # directory): start over from an empty image.
                self.log.warning("metadata offset out of range; refetching", error=exc.message)
                self._reset()
                failures += 1
            except (ReplayError, MetadataGapError) as exc:
                self.log.error("metadata replay failed; refetching from 0", error=str(exc))
                self._reset()
                failures += 1
            except NetworkError as exc:
                if failures == 0:
                    self.log.warning("metadata fetch failed; will retry", error=exc.message)
                failures += 1
            except MetactlError as exc:
                self.log.warning("metadata fetch refused; will retry", error=str(exc))
                failures += 1
            except Exception:
                self.log.exception("metadata fetch: unexpected error")
                failures += 1
            if failures:
                await asyncio.sleep(min(0.05 * 2 ** min(failures, 6), 2.0))  # retry backoff

    def _reset(self) -> None:
        self.state = LogReplay()
        self._replaced = True
        self.controller_end_offset = None
        self.lagging_since = None

    def _apply(self, resp: FetchMetadataResponse) -> None:
        before = self.image.end_offset
        self.state, delta = apply_fetch(self.state, resp)
        if self._replaced:
            delta, self._replaced = None, False
        self.controller_end_offset = resp.end_offset
        if self.image.end_offset >= resp.end_offset:
            self.lagging_since = None
        elif self.lagging_since is None:
            self.lagging_since = time.monotonic()
        if self.image.end_offset != before:
            with contextlib.suppress(OSError):
                write_metadata_offset(self.data_dir, self.image.end_offset)
        caught_up = self.caught_up
        for listener in self.listeners:
            listener(self.image, delta, caught_up)
        self.updated.set()
        self.updated.clear()
