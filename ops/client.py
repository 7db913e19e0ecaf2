"""Offline readers of a data directory, for the commands that only read.

Online commands talk to a running controller with `protocol.codec.request_once`.
"""

from __future__ import annotations

from pathlib import Path

from controller.runtime.driver import load_image
from metadata_image.image import ClusterImage
from metadata_log.sqlite_store import SqliteLogStore


def controller_log_dir(data_dir: Path) -> Path:
    """A cluster data dir keeps the controller's log in `controller/`; accept either."""
    sub = data_dir / "controller"
    return sub if sub.is_dir() else data_dir


async def offline_image(data_dir: Path) -> tuple[ClusterImage, int]:
    store = await SqliteLogStore.open(controller_log_dir(data_dir), read_only=True)
    try:
        return await load_image(store), store.end_offset
    finally:
        await store.close()
