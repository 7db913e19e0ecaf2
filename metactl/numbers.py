"""The one reader of numbers that metactl takes from people and files: configs, flags,
``--config`` files and ``METACTL_*`` variables, command arguments such as
``--feature NAME=LEVEL`` or ``--replica-assignment 1:2:3``, and ``meta.properties``.

Integers are read as Kafka reads an integer config (`ConfigDef.parseType`: the text
trimmed as Java's ``String.trim`` trims, then ``Integer.parseInt`` or ``Long.parseLong``):
an optional ``+`` or ``-`` and one or more of the digits 0-9, nothing else, within the
type's range. So ``1_0``, ``0x10``, ``1e3``, ``1.0``, ``1 0``, ``+``, ``-`` and the
empty text are refused, where Python's ``int`` takes ``1_0`` as 10. Surrounding
characters up to U+0020 (spaces, tabs, newlines, other control characters) are trimmed,
as Java's ``trim`` does; other blanks (U+00A0, U+3000) are not, where Python's ``strip``
and ``int`` take them.

One deliberate difference from Kafka: Java's ``Integer.parseInt`` also takes the decimal
digits of other scripts (``Character.digit``: ``１０``, fullwidth, and ``١٠``,
Arabic-Indic, are 10 to Kafka); metactl takes only the ASCII digits 0-9
(docs/configuration.md, How numbers are read).

Decimals (seconds, rates) are read by the same rule, with an optional fraction and
exponent: ``[+-]?(D+[.D*]|.D+)([eE][+-]?D+)?`` with D the digits 0-9. ``inf``, ``nan``,
hex floats, underscores and Java's ``d``/``f`` suffixes are refused, and so is a value
too large to be finite.

Each reader raises `NumberFormatError` (a ValueError); `parse_int` and `parse_decimal`
turn it into INVALID_CONFIG naming what was read, and `int_flag`, `long_flag` and
`decimal_flag` are argparse types that turn it into argparse's own usage error (exit 2,
``argument --partitions: ...``). Standard library only, like the rest of this package.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import Final

from metactl.errors import InvalidConfigurationError

__all__ = [
    "INT32_MAX",
    "INT32_MIN",
    "INT64_MAX",
    "INT64_MIN",
    "NumberFormatError",
    "decimal_arg",
    "decimal_flag",
    "int_arg",
    "int_flag",
    "is_digits",
    "kafka_decimal",
    "kafka_int",
    "long_arg",
    "long_flag",
    "parse_decimal",
    "parse_int",
]

INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1

# Java's String.trim: every character up to U+0020 at either end, nothing else.
_JAVA_BLANKS: Final = "".join(chr(c) for c in range(0x21))
_INT: Final = re.compile(r"[+-]?[0-9]+", re.ASCII)
_DECIMAL: Final = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_SHOWN: Final = 64  # characters of a refused text quoted in a message


class NumberFormatError(ValueError):
    """The text is not a number by the rule of this module, or is out of range."""


def _quoted(text: str) -> str:
    return repr(text[:_SHOWN] + ("..." if len(text) > _SHOWN else ""))


def is_digits(text: str) -> bool:
    """One or more of the ASCII digits 0-9 and nothing else (no sign, no blanks): the
    rule for a port, or a partition index in ``TOPIC-N``. ``str.isdigit`` is not it: it
    takes ``²`` and ``١``."""
    return text.isascii() and text.isdigit()


def kafka_int(text: str, minimum: int = INT32_MIN, maximum: int = INT32_MAX) -> int:
    """`text` as Kafka's parser reads an integer (see the module's docstring), within
    ``minimum .. maximum`` (default: Java's int); NumberFormatError if not."""
    if not isinstance(text, str):
        raise NumberFormatError(f"expected a number as text, got {text!r}")
    trimmed = text.strip(_JAVA_BLANKS)
    if not _INT.fullmatch(trimmed):
        raise NumberFormatError(
            f"not an integer (an optional sign and the digits 0-9): {_quoted(text)}"
        )
    value = int(trimmed)
    if not minimum <= value <= maximum:
        raise NumberFormatError(f"{trimmed} is out of range ({minimum} .. {maximum})")
    return value


def kafka_decimal(text: str, minimum: float | None = None) -> float:
    """`text` as a decimal number (see the module's docstring), finite and at least
    `minimum` if given; NumberFormatError if not."""
    if not isinstance(text, str):
        raise NumberFormatError(f"expected a number as text, got {text!r}")
    trimmed = text.strip(_JAVA_BLANKS)
    if not _DECIMAL.fullmatch(trimmed):
        raise NumberFormatError(
            f"not a decimal number (digits 0-9, an optional sign, fraction and exponent): "
            f"{_quoted(text)}"
        )
    value = float(trimmed)
    if not math.isfinite(value):
        raise NumberFormatError(f"{_quoted(trimmed)} is too large")
    if minimum is not None and value < minimum:
        raise NumberFormatError(f"must be at least {minimum:g}, got {trimmed}")
    return value


def parse_int(text: str, what: str, *, minimum: int = INT32_MIN, maximum: int = INT32_MAX) -> int:
    """`kafka_int`, a mistake being INVALID_CONFIG that names `what` (a config's or a
    flag's name)."""
    try:
        return kafka_int(text, minimum, maximum)
    except NumberFormatError as exc:
        raise InvalidConfigurationError(f"{what}: {exc}") from None


def parse_decimal(text: str, what: str, *, minimum: float | None = None) -> float:
    """`kafka_decimal`, a mistake being INVALID_CONFIG that names `what`."""
    try:
        return kafka_decimal(text, minimum)
    except NumberFormatError as exc:
        raise InvalidConfigurationError(f"{what}: {exc}") from None


def int_flag(
    minimum: int = INT32_MIN, maximum: int = INT32_MAX, name: str = "int"
) -> Callable[[str], int]:
    """An argparse ``type=``: `kafka_int` within the bounds; a mistake is argparse's
    usage error naming the flag (exit 2). Also read by `metactl.settings` for a
    ``--config`` file's or a ``METACTL_*`` variable's value (INVALID_CONFIG there)."""

    def read(text: str) -> int:
        try:
            return kafka_int(text, minimum, maximum)
        except NumberFormatError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    read.__name__ = name
    return read


def long_flag(minimum: int = INT64_MIN, maximum: int = INT64_MAX) -> Callable[[str], int]:
    """`int_flag` in Java's long range: milliseconds, offsets, record counts, seeds."""
    return int_flag(minimum, maximum, name="long")


def decimal_flag(minimum: float | None = None) -> Callable[[str], float]:
    """An argparse ``type=``: `kafka_decimal` (at least `minimum` if given)."""

    def read(text: str) -> float:
        try:
            return kafka_decimal(text, minimum)
        except NumberFormatError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    read.__name__ = "decimal"
    return read


# The argparse types of most flags: Java's int (counts, ids, ports, seconds), Java's long
# (milliseconds, offsets, record counts, seeds), a decimal (seconds, rates, days).
int_arg: Final = int_flag()
long_arg: Final = long_flag()
decimal_arg: Final = decimal_flag()
