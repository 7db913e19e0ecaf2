"""`cluster up`'s control socket (`localcluster.control`): it is its user's only (mode 0600)
without the process-wide umask being touched (issue 22: the old bind set the umask
around it, which every other thread's new files shared meanwhile), a stale socket is
replaced, nothing is left beside it, and it answers."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from localcluster.control import CONTROL_SOCKET, ask, serve


async def _echo(request: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, "pid": 1, "echo": request}


def test_the_control_socket_is_private_without_touching_the_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stale = tmp_path / CONTROL_SOCKET
    stale.write_text("a socket file left by a killed cluster up")
    real_umask = os.umask
    calls: list[int] = []

    def spy(mask: int) -> int:
        calls.append(mask)
        return real_umask(mask)

    async def run() -> tuple[os.stat_result, dict[str, Any], list[str]]:
        server = await serve(tmp_path, _echo)
        try:
            st = os.lstat(tmp_path / CONTROL_SOCKET)
            entries = sorted(os.listdir(tmp_path))
            answer = await asyncio.to_thread(ask, tmp_path, {"start_broker": 2}, 10.0)
        finally:
            server.close()
            await server.wait_closed()
        return st, answer, entries

    # The most permissive umask: a socket bound under it, as it is, would be 0777.
    old = real_umask(0)
    try:
        monkeypatch.setattr(os, "umask", spy)
        st, answer, entries = asyncio.run(run())
    finally:
        monkeypatch.undo()
        real_umask(old)
    assert calls == [], "the process-wide umask was changed"
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert entries == [CONTROL_SOCKET]  # the stale file replaced, no private directory left
    assert answer == {"ok": True, "pid": 1, "echo": {"start_broker": 2}}
