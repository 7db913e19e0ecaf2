"""How the CLI reaches a data directory or a running controller.

Offline commands read the log directly; online ones talk to a running controller with
`call`, over the shared reconnecting client (`protocol.client`), retrying retriable
errors briefly.
"""

from __future__ import annotations

from pathlib import Path

from controller.runtime.driver import load_image
from metadata_image.image import ClusterImage
from metadata_log.sqlite_store import SqliteLogStore
from protocol.client import DEFAULT_TIMEOUT_S, RetryPolicy, request_once
from protocol.messages import Message

# An operator command retries a retriable refusal (e.g. no eligible leader yet) a few
# times within a couple of seconds, then reports it.
CLI_RETRY = RetryPolicy(attempts=4, base_s=0.2, cap_s=1.0)


async def call(
    address: str,
    body: Message,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    retry: RetryPolicy = CLI_RETRY,
) -> Message:
    """One request to the controller at `address`; raises the coded error it answers."""
    return await request_once(address, body, timeout_s, retry=retry)


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
