"""Progress of a long command (`metactl simulate faults`, `metactl chaos run`) on stderr.

On a terminal, one `rich` progress bar (done of total, a status text, elapsed time and
the time left); it vanishes when the command ends, leaving its summary. Elsewhere (a
pipe, a log file, CI), one plain line at the first update and then at most one every
`every_s` seconds, and one at the end, so a log never goes silent for long::

    simulate faults: 300/2000 schedules (15%), 0 lost silently; 6 s elapsed, about 34 s left

Lines are written by `update` itself (no thread, no timer): whoever calls it often enough
(every schedule, every sample of a chaos run) gets them on time, and a test drives it
with a clock of its own. Mode `off` prints nothing; `auto` is bars on a terminal, lines
elsewhere (as `metactl audit`'s `--progress`, audit/progress.py, with lines for logs).

This module only displays what its caller counts.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final, Literal, TextIO

Mode = Literal["auto", "bars", "lines", "off"]
MODES: Final = ("auto", "bars", "lines", "off")
EVERY_S: Final = 5.0


def resolve_mode(mode: Mode, stream: TextIO) -> Mode:
    """`auto`: bars on a terminal, lines elsewhere."""
    if mode != "auto":
        return mode
    isatty = getattr(stream, "isatty", None)
    return "bars" if isatty is not None and isatty() else "lines"


class Progress:
    """Progress of one long run toward `total` `unit`s (see the module docs)."""

    def __init__(
        self,
        description: str,
        total: float | None,
        *,
        unit: str = "",
        mode: Mode = "auto",
        stream: TextIO | None = None,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.description = description
        self.total = total
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.mode: Mode = resolve_mode(mode, self.stream)
        self.every_s = every_s
        self.clock = clock
        self.started = clock()
        self.done = 0.0
        self.status = ""
        self.left_s: float | None = None
        self.lines = 0  # lines written (lines mode)
        self._last_line: float | None = None
        self._last_text = ""
        self._bars: Any = None
        self._task: Any = None
        if self.mode == "bars":
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import (
                Progress as Bars,
            )

            columns: list[Any] = [TextColumn("{task.description}"), BarColumn(bar_width=24)]
            if unit:
                columns += [MofNCompleteColumn(), TextColumn(unit)]
            else:
                columns.append(TextColumn("{task.percentage:>3.0f}%"))
            columns += [
                TextColumn("{task.fields[status]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
            ]
            self._bars = Bars(
                *columns,
                console=Console(file=self.stream, force_terminal=True),
                transient=True,
            )
            self._task = self._bars.add_task(description, total=total, status="")
            self._bars.start()

    # --- updates --------------------------------------------------------------------------

    def update(
        self, done: float | None = None, status: str | None = None, *, left_s: float | None = None
    ) -> None:
        """Where the run is: `done` of `total`, a short status text, and the time left
        when the caller knows it better than a projection of the pace so far."""
        if done is not None:
            self.done = done
        if status is not None:
            self.status = status
        self.left_s = left_s
        if self._bars is not None:
            self._bars.update(self._task, completed=self.done, status=self.status)
        elif self.mode == "lines":
            now = self.clock()
            if self._last_line is None or now - self._last_line >= self.every_s:
                self._last_line = now
                self._line(now)

    def note(self, text: str) -> None:
        """A line of its own (an event of the run): above the bar on a terminal."""
        if self._bars is not None:
            self._bars.console.print(text, markup=False, highlight=False, soft_wrap=True)
        elif self.mode != "off":
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        """The bar goes; in lines mode, one last line says where the run ended."""
        if self._bars is not None:
            self._bars.stop()
            self._bars = None
        elif self.mode == "lines" and self._last_line is not None:
            self._last_line = self.clock()
            self._line(self._last_line, final=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- lines ------------------------------------------------------------------------------

    def text(self, now: float, *, final: bool = False) -> str:
        elapsed = now - self.started
        parts = [f"{self.description}: "]
        if self.total:
            share = min(1.0, self.done / self.total)
            amount = f"{self.done:,.0f}/{self.total:,.0f}" + (f" {self.unit}" if self.unit else "")
            parts.append(f"{amount} ({share:.0%})")
        else:
            parts.append(f"{self.done:,.0f} {self.unit}".rstrip())
        if self.status:
            parts.append(f", {self.status}")
        parts.append(f"; {elapsed:.0f} s elapsed")
        if not final and self.left_s is not None:
            parts.append(f", about {self.left_s:.0f} s left")
        elif not final and self.total and 0 < self.done < self.total:
            left = elapsed * (self.total - self.done) / self.done
            parts.append(f", about {left:.0f} s left")
        return "".join(parts)

    def _line(self, now: float, *, final: bool = False) -> None:
        text = self.text(now, final=final)
        if final and text == self._last_text:
            return  # said just now
        self._last_text = text
        self.lines += 1
        print(text, file=self.stream, flush=True)
