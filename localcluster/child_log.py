"""A child process's log as an operator reads it (`cluster up`'s start failures and death
reports, `broker start`'s failures).

The controller and the brokers log structlog JSON lines on stderr, and print their one
`error: NAME: message` line there when they cannot start; etcd logs zap JSON lines.
`readable` turns a JSON line into ``level event key=value ...`` (no timestamp: the
lines are the last few of one run), anything else is kept as it is; `failure_reason` is
the line that says why the child stopped, for the one-line error. Decides nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Final

__all__ = [
    "LOG_TAIL_LINES",
    "TAIL_MAX_BYTES",
    "failure_reason",
    "readable",
    "readable_tail",
    "tail_lines",
]

LOG_TAIL_LINES: Final = 8
# The most of a log's end read for its tail (a JSON line with a traceback is a few KB).
TAIL_MAX_BYTES: Final = 256 * 1024
RUN_MARK: Final = "--- "  # `cluster up`'s line before each start of a child
MAX_VALUE_CHARS: Final = 200
_TIME_KEYS: Final = ("timestamp", "ts", "time")
_EVENT_KEYS: Final = ("event", "msg", "message")
_ERROR_LEVELS: Final = frozenset({"error", "critical", "fatal", "panic"})


def tail_lines(path: Path, n: int = LOG_TAIL_LINES, max_bytes: int = TAIL_MAX_BYTES) -> list[str]:
    """The last `n` lines of a log file, as written (no newline); [] if unreadable.

    Only the file's last `max_bytes` are read, however large it has grown (a child logs
    for as long as it runs, and `cluster up` reads the tail on its event loop when the
    child dies): a line cut by that bound is left out, unless it is the only one, whose
    end is then kept."""
    try:
        with path.open("rb") as f:
            start = max(0, f.seek(0, os.SEEK_END) - max_bytes)
            f.seek(start)
            data = f.read(max_bytes)
    except OSError:
        return []
    # As a text-mode file reads it: universal newlines, undecodable bytes replaced.
    text = data.decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    if start > 0 and len(lines) > 1:
        lines.pop(0)  # the end of a line that began before the bound
    return lines[-n:] if n > 0 else []


def _json(line: str) -> dict[str, Any] | None:
    if not line.startswith("{"):
        return None
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _value(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v, separators=(",", ":"), ensure_ascii=False)
    text = " ".join(text.split())  # one line, whatever the value held (a traceback)
    if len(text) > MAX_VALUE_CHARS:
        text = text[: MAX_VALUE_CHARS - 1] + "…"
    if not text or any(c in text for c in ' ="'):
        return json.dumps(text, ensure_ascii=False)
    return text


def _pop_first(doc: dict[str, Any], keys: tuple[str, ...]) -> Any:
    found = None
    for key in keys:
        if key in doc:
            value = doc.pop(key)
            if found is None:
                found = value
    return found


def readable(line: str) -> str:
    """A JSON log line as ``level event key=value ...``; any other line as it is."""
    doc = _json(line)
    if doc is None:
        return line
    _pop_first(doc, _TIME_KEYS)
    level = doc.pop("level", None)
    event = _pop_first(doc, _EVENT_KEYS)
    parts = [str(level)] if level is not None else []
    if event is not None:
        parts.append(" ".join(str(event).split()))
    parts += [f"{k}={_value(v)}" for k, v in doc.items()]
    return " ".join(parts)


def readable_tail(path: Path, n: int = LOG_TAIL_LINES, indent: str = "    ") -> list[str]:
    """The last `n` lines of a child's log, readable and indented; a note if empty."""
    lines = [indent + readable(line) for line in tail_lines(path, n)]
    return lines or [f"{indent}(its log is empty)"]


def failure_reason(lines: list[str]) -> str | None:
    """Why the child stopped, from the end of its log: its last `error: NAME: message`
    line (without `error: `), else its last error-level JSON line (event and error).
    Only the last run counts: the lines after the last `--- ... starts` marker (`cluster
    up` appends one to the log before each start)."""
    marks = [i for i, line in enumerate(lines) if line.startswith(RUN_MARK)]
    if marks:
        lines = lines[marks[-1] + 1 :]
    for line in reversed(lines):
        if line.startswith("error: "):
            return line.removeprefix("error: ").strip()
    for line in reversed(lines):
        doc = _json(line)
        if doc is None or str(doc.get("level", "")).lower() not in _ERROR_LEVELS:
            continue
        event = " ".join(str(_pop_first(dict(doc), _EVENT_KEYS) or "").split())
        error = doc.get("error")
        if error:
            return f"{event}: " + " ".join(str(error).split())
        return event or None
    return None
