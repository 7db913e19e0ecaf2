"""`cluster up`'s control socket and its record of the cluster (issue 22: bring a broker
back; issue 33: a controller too; issue 34: restart a broker for a roll).

`cluster up` records how it runs the cluster in ``DATA_DIR/cluster-up.json`` (its pid,
the controllers, each controller's node id, command line, pid and addresses, Kafka's
included, each broker's command line, pid, metrics and Kafka addresses and log, and the
certificates its clients use, ``"tls_dir"``, null with --insecure), and listens on the
Unix socket ``DATA_DIR/cluster.sock`` (mode 0600: only its user, made so without a
process-wide umask, `bind_private`) for one request per connection: start broker N, or
controller cN, again with its recorded command line; restart running broker N (a
controlled shutdown, then that start); or wait for such a restart to end
(`localcluster.restarts`). `metactl broker start`, `metactl controller start` and
`metactl roll` are the clients. What it starts is `cluster up`'s own child, as the first
one was: supervised, reported if it dies, stopped in order on Ctrl-C.

The protocol is one JSON line each way: ``{"start_broker": N}``,
``{"start_controller": "cN"}``, ``{"restart_broker": N}`` or ``{"await_broker": N}``,
answered by ``{"ok": true, ...}`` (a start: ``"pid": P, "ready": "READY ...", "log":
PATH``; a restart adds ``"stopped": {...}``; a wait: ``"running"``, ``"pid"``) or
``{"ok": false, "code": NAME, "message": ..., "details": [lines]}``. Decides nothing
about the cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import stat
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

from metactl.errors import (
    InvalidRequestError,
    MetactlError,
    NetworkError,
    details_of,
    error_for_code,
    with_details,
)

__all__ = ["CONTROL_SOCKET", "RECORD_FILE", "AskInterrupted", "ask", "serve", "write_record"]

CONTROL_SOCKET: Final = "cluster.sock"
RECORD_FILE: Final = "cluster-up.json"
MAX_REQUEST_BYTES: Final = 4096
READ_TIMEOUT_S: Final = 10.0
SOCKET_MODE: Final = 0o600
LISTEN_BACKLOG: Final = 16

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class AskInterrupted(KeyboardInterrupt):
    """Ctrl-C once the request was sent: `cluster up` has it, and carries it out."""


def write_record(data_dir: Path, record: dict[str, Any]) -> Path:
    """``DATA_DIR/cluster-up.json``, replaced atomically."""
    path = data_dir / RECORD_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def failure(exc: MetactlError) -> dict[str, Any]:
    return {
        "ok": False,
        "code": exc.code,
        "message": exc.message,
        "details": list(details_of(exc)),
    }


async def serve(data_dir: Path, handler: Handler) -> asyncio.AbstractServer:
    """Listen on ``DATA_DIR/cluster.sock`` (a stale one is replaced: `cluster up` holds
    the data directory's lock, so no other one listens there)."""
    path = data_dir / CONTROL_SOCKET

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                line = await asyncio.wait_for(reader.readline(), READ_TIMEOUT_S)
                request = json.loads(line[:MAX_REQUEST_BYTES] or b"null")
                if not isinstance(request, dict):
                    raise InvalidRequestError("a control request is one JSON object")
            except MetactlError as exc:
                answer = failure(exc)
            except (ValueError, TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
                answer = failure(InvalidRequestError(f"unreadable control request: {exc}"))
            else:
                try:
                    answer = await handler(request)
                except MetactlError as exc:
                    answer = failure(exc)
                except Exception as exc:
                    # The handler's own failure (spawning a process, writing its log):
                    # the client hears its cause, and `cluster up` keeps serving.
                    answer = failure(MetactlError(f"{type(exc).__name__}: {exc}"))
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass  # the client went away
        finally:
            writer.close()

    sock = bind_private(path)
    try:
        return await asyncio.start_unix_server(one, sock=sock)
    except BaseException:
        sock.close()
        with contextlib.suppress(OSError):
            path.unlink()
        raise


def bind_private(path: Path) -> socket.socket:
    """A Unix socket listening on `path`, mode 0600 (its user only), without touching the
    process-wide umask (which every thread's new files share). It is bound inside a new
    private directory (`mkdtemp`: mode 0700, so no one else can reach the socket while
    its mode is still the umask's), given mode 0600 there and checked, then renamed to
    `path` (atomically replacing a stale socket). OSError if any step fails."""
    # ".sXXXXXXXX/s": no longer than "cluster.sock", for the 107 bytes a Unix path may have.
    private = Path(tempfile.mkdtemp(prefix=".s", dir=path.parent))
    inner = private / "s"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(inner))
        os.chmod(inner, SOCKET_MODE)
        st = os.lstat(inner)
        if not stat.S_ISSOCK(st.st_mode) or stat.S_IMODE(st.st_mode) != SOCKET_MODE:
            raise PermissionError(f"{inner}: mode {stat.S_IMODE(st.st_mode):o}, not 600")
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
        os.rename(inner, path)
    except BaseException:
        sock.close()
        with contextlib.suppress(OSError):
            inner.unlink()
        raise
    finally:
        with contextlib.suppress(OSError):
            private.rmdir()
    return sock


def ask(data_dir: Path, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """The answer of the `cluster up` running on `data_dir`; NETWORK_EXCEPTION when none
    runs there, a rebuilt named error when it refuses (its `details` kept)."""
    path = data_dir / CONTROL_SOCKET
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        try:
            s.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            raise NetworkError(
                f"no `metactl cluster up` is running on {data_dir} (nothing listens on "
                f"{path}): `make run` or `metactl cluster up --data-dir {data_dir}` starts "
                "the whole cluster"
            ) from None
        try:
            # Sent in one send(): a request is far smaller than the socket's buffer. So a
            # Ctrl-C that sendall raises (it looks for signals after each send) comes
            # once the request is sent too.
            s.sendall(json.dumps(request).encode() + b"\n")
            with s.makefile("rb") as f:
                line = f.readline()
        except KeyboardInterrupt:
            raise AskInterrupted() from None
    if not line:
        raise NetworkError(f"`cluster up` on {data_dir} closed the control socket unanswered")
    answer: dict[str, Any] = json.loads(line)
    if not answer.get("ok"):
        exc = error_for_code(str(answer.get("code")), str(answer.get("message", "")))
        raise with_details(exc, answer.get("details") or ())
    return answer
