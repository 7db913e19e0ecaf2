"""A small admin client for the controller, and offline readers of a data directory.

Commands that only read work offline on a data directory; everything else talks to a
running controller over the wire protocol.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from controller.driver import load_image
from controller.image import ClusterImage
from metactl.wire import Connection, Message, parse_address
from metadata_log.sqlite_store import SqliteLogStore


async def call(controller: str, body: Message, timeout_s: float = 30.0) -> Message:
    host, port = parse_address(controller)
    conn = await asyncio.wait_for(Connection.open(host, port), timeout_s)
    try:
        return await asyncio.wait_for(conn.request(body), timeout_s)
    finally:
        await conn.close()


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
