"""Times on the command line: durations and `--since`/`--until` read.

`parse_duration_ms` reads 30s, 10m, 2h, 1d, 500ms; `parse_since` a duration back from
now, an ISO 8601 time or (where a flag allows it) epoch milliseconds. A bad value is
INVALID_CONFIG naming its flag. Pure: no IO, no clock (`now_ms` is given). Times are
shown as the event feed shows them (`eventfeed.feed.iso_ms`).
"""

from __future__ import annotations

import re
from typing import Final

from metactl.errors import InvalidConfigurationError

# ASCII digits only (`metactl.numbers`: `\d` would take "١٠m").
_DURATION: Final = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)\s*$", re.ASCII)
_UNIT_MS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_EPOCH_MS: Final = re.compile(r"^\s*-?[0-9]+\s*$", re.ASCII)


def parse_duration_ms(text: str, flag: str) -> int:
    """`10m`, `2h`, `1d`, `30s`, `500ms` in milliseconds, or a bare `0` (no time at all
    needs no unit); INVALID_CONFIG otherwise."""
    if text.strip() == "0":
        return 0
    m = _DURATION.match(text)
    if m is None:
        raise InvalidConfigurationError(
            f"{flag} {text!r}: expected a duration such as 30s, 10m, 2h or 1d"
        )
    return int(float(m.group(1)) * _UNIT_MS[m.group(2)])


def parse_since(text: str, now_ms: int, flag: str = "--since", *, epoch_ms: bool = False) -> int:
    """`--since`: a duration back from `now_ms` (10m, 2h, 1d), an ISO 8601 time (UTC
    unless it says otherwise) or, with `epoch_ms`, epoch milliseconds; in epoch
    milliseconds (`simulation.history_config.parse_time_ms` reads the times).
    INVALID_CONFIG naming `flag` otherwise."""
    from simulation.history_config import parse_time_ms  # not for a duration (issue 34)

    if _DURATION.match(text):
        return now_ms - parse_duration_ms(text, flag)
    when = text
    if not epoch_ms and _EPOCH_MS.match(text):
        # A bare number is no epoch time here; as an ISO date (YYYYMMDD) it is midnight.
        when = text.strip() + "T00"
    try:
        return parse_time_ms(when)
    except ValueError:
        kinds = ["a duration back from now (10m, 2h, 1d)", "an ISO 8601 time"]
        kinds += ["epoch milliseconds"] if epoch_ms else []
        raise InvalidConfigurationError(
            f"{flag} {text!r}: expected {', '.join(kinds[:-1])} or {kinds[-1]}"
        ) from None
