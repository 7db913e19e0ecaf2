"""Helper process for test_crash: append batches until killed, print each acknowledgement.

Usage: python crash_writer.py DATA_DIR. Several tasks append concurrently (so group
commits are always in flight); after each `append` returns, the task prints
``<batch number> <first offset> <end offset>`` and flushes. Batch ``i`` holds
`log_fixtures.crash_batch(i)`, so the test can rebuild what was acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from log_fixtures import crash_batch

from metactl.logs import configure
from metadata_log.sqlite_store import SqliteLogStore

WRITERS = 8


async def main(data_dir: str) -> None:
    store = await SqliteLogStore.open(data_dir)
    print("ready", flush=True)

    async def writer(k: int) -> None:
        i = k
        while True:
            # Equal timestamps for neighbours: some batches get stored together.
            offsets = await store.append(crash_batch(i), timestamp_ms=i // 3)
            print(f"{i} {offsets.start} {offsets.stop}", flush=True)
            i += WRITERS

    await asyncio.gather(*(writer(k) for k in range(WRITERS)))


if __name__ == "__main__":
    configure(json=False, level=logging.WARNING, stream=sys.stderr)
    asyncio.run(main(sys.argv[1]))
