"""asyncio stream helpers over the sans-IO codec: read one frame's payload.

Shared by the server loop and the client; the codec itself stays free of IO.
"""

from __future__ import annotations

import asyncio

from protocol.codec import DEFAULT_MAX_FRAME_BYTES, HEADER_BYTES, frame_length


async def read_frame(
    reader: asyncio.StreamReader, max_bytes: int = DEFAULT_MAX_FRAME_BYTES
) -> bytes:
    """The next frame's payload. Raises IncompleteReadError at EOF (clean or truncated) and
    FrameTooLargeError for a length over `max_bytes` (the stream is then unusable)."""
    length = frame_length(await reader.readexactly(HEADER_BYTES), max_bytes)
    return await reader.readexactly(length)
