"""Loading the committed metadata log into an image: the newest snapshot plus every
record after it, replayed a chunk at a time, without a transaction the log ends inside
(held back on `LogReplay.transaction`) or any aborted one (`metadata_image.transactions`).

The driver (`Controller.open`), a standby's tail (`controller.runtime.standby`), the
offline CLI commands, the tests and the benches start from here. Read-only: it never
appends (the abort of an unfinished transaction is the driver's, at start-up or a
takeover) and decides nothing.
"""

from __future__ import annotations

import gc
from typing import Final

from metactl.errors import LogError
from metadata_image.image import ClusterImage
from metadata_image.snapshot import ImageSnapshot, from_snapshot
from metadata_image.transactions import LogReplay, replay_log
from metadata_log.records import MetadataRecord
from metadata_log.store import LogStore

__all__ = ["load_image", "load_log", "snapshot_image"]

REPLAY_CHUNK: Final = 10_000


async def load_log(store: LogStore, *, start: LogReplay | None = None) -> LogReplay:
    """The committed log, replayed: the newest snapshot plus every record after it, with
    an unfinished transaction at the end held back (`LogReplay.transaction`).

    `start` is what a reader already replayed (a standby's image): only the records after
    it are read, unless the log no longer holds them (deleted before a snapshot)."""
    # Decoding and replaying millions of records allocates objects that form no cycles;
    # the cyclic GC's repeated full passes over the growing heap would dominate.
    paused = gc.isenabled()
    gc.disable()
    try:
        if start is not None and store.start_offset <= start.next_offset <= store.end_offset:
            return await _replay_from(store, start)
        return await _replay_from(store, LogReplay(await snapshot_image(store)))
    finally:
        if paused:
            gc.enable()


async def snapshot_image(store: LogStore) -> ClusterImage:
    """Where replay starts: the newest snapshot's image, or an empty one for a log that
    still starts at offset 0; LogError for a log truncated with no snapshot to start from."""
    snap = await store.load_snapshot(ImageSnapshot)
    if snap is not None:
        return from_snapshot(snap[1])
    if store.start_offset > 0:
        raise LogError(
            f"the log starts at offset {store.start_offset} and there is no snapshot to start from"
        )
    return ClusterImage()


async def _replay_from(store: LogStore, state: LogReplay) -> LogReplay:
    chunk: list[MetadataRecord] = []
    async for entry in store.iter_entries(state.next_offset):
        chunk.append(entry.record)
        if len(chunk) >= REPLAY_CHUNK:
            state = replay_log(state, chunk)
            chunk = []
    return replay_log(state, chunk)


async def load_image(store: LogStore) -> ClusterImage:
    """The committed image: the newest snapshot plus every record after it, without a
    transaction the log ends inside or any aborted one."""
    return (await load_log(store)).image
