"""Settings of a long-running process from three layers: a TOML file (``--config FILE``),
``METACTL_*`` environment variables, and command-line flags, each overriding the one
before, over the built-in defaults.

`layered(parser)` prepares a parser (`controller serve`, `broker run`): it adds
``--config`` and marks every option's default as not given, so that after parsing,
`resolve(parser, args)` can tell a flag given on the command line from one left at its
default, and fill the latter from the environment, then the file, then the default.
The parsed arguments name their parser (``settings_parser``), so an entry point only
calls `resolve_settings(args)`, which prints a mistake as one ``error:`` line.

* A file key is an option's long name without the dashes, either spelling:
  ``heartbeat-interval-ms = 2000`` or ``heartbeat_interval_ms = 2000``. TOML types must
  fit: an integer option takes an integer (or a string the option's type reads), a
  switch takes true or false, a choice one of its choices.
* An environment variable is ``METACTL_`` and the option's name in capitals with
  underscores: ``METACTL_HEARTBEAT_INTERVAL_MS=2000``. Variables that name no option of
  the command are ignored (other commands have other options).
* A required option may come from any layer; one missing from all is named.

Every mistake (an unknown key, a value of the wrong type, an unreadable file) is an
`InvalidConfigurationError` naming the key and where it came from. Stdlib only; it knows
no option of its own but ``--config``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from metactl.errors import InvalidConfigurationError

__all__ = ["ENV_PREFIX", "NotGiven", "layered", "resolve", "resolve_settings"]

ENV_PREFIX: Final = "METACTL_"
_SKIP: Final = ("help", "config")
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})


class NotGiven:
    """An option's default, standing in until `resolve` knows no layer sets it."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if a.option_strings and a.dest not in _SKIP and a.help != argparse.SUPPRESS
    ]


def layered(parser: argparse.ArgumentParser) -> None:
    """Add ``--config FILE``, defer every option's default to `resolve`, and have the
    parsed arguments name this parser (``settings_parser``, for `resolve_settings`)."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="a TOML file of settings (keys: the long option names); METACTL_* variables "
        "override it and flags override both (docs/configuration.md) (default: none)",
    )
    for a in _options(parser):
        if not isinstance(a.default, NotGiven):
            a.default = NotGiven(a.default)
        if a.required:
            a.required = False
            a.__dict__["_metactl_required"] = True
    parser.set_defaults(settings_parser=parser)


def keys_of(a: argparse.Action) -> list[str]:
    """The option's long names without dashes (an alias is a key too), longest first."""
    longs = [o.lstrip("-") for o in a.option_strings if o.startswith("--")]
    return sorted(longs, key=len, reverse=True)


def env_name(key: str) -> str:
    return ENV_PREFIX + key.upper().replace("-", "_")


def resolve(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    environ: Mapping[str, str] | None = None,
) -> argparse.Namespace:
    """Fill every option not given as a flag from the environment, the file or its
    default (in that order); returns `args`."""
    environ = os.environ if environ is None else environ
    path = getattr(args, "config", None)
    file = _load(Path(path)) if path else {}
    options = _options(parser)
    known = {k for a in options for k in keys_of(a)}
    unknown = sorted(k for k in file if k.replace("_", "-") not in known)
    if unknown:
        raise InvalidConfigurationError(
            f"unknown setting(s) {', '.join(unknown)} in {path} (known: {', '.join(sorted(known))})"
        )
    by_key = {k.replace("_", "-"): v for k, v in file.items()}
    for a in options:
        current = getattr(args, a.dest, None)
        if not isinstance(current, NotGiven):
            continue  # given on the command line
        keys = keys_of(a)
        from_env = next((env_name(k) for k in keys if env_name(k) in environ), None)
        from_file = next((k for k in keys if k in by_key), None)
        if from_env is not None:
            value = _convert(a, environ[from_env], f"${from_env}")
        elif from_file is not None:
            value = _convert(a, by_key[from_file], f"{from_file} in {path}")
        elif a.__dict__.get("_metactl_required"):
            raise InvalidConfigurationError(
                f"--{keys[-1]} is required (a flag, ${env_name(keys[-1])}, or {keys[-1]} "
                "in a --config file)"
            )
        else:
            value = current.value
        setattr(args, a.dest, value)
    return args


def resolve_settings(args: argparse.Namespace) -> bool:
    """`resolve` the arguments of a `layered` parser (those of another parser are left
    as they are). A mistake is printed on stderr as ``error: CODE: message`` and False
    returned: the entry point exits with status 2, as argparse does for a bad flag."""
    parser = getattr(args, "settings_parser", None)
    if parser is None:
        return True
    try:
        resolve(parser, args)
    except InvalidConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return False
    return True


def _load(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise InvalidConfigurationError(f"cannot read --config {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidConfigurationError(f"--config {path} is not valid TOML: {exc}") from None


def _convert(a: argparse.Action, raw: Any, where: str) -> Any:
    switch = isinstance(a, argparse._StoreTrueAction | argparse._StoreFalseAction)
    if switch:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in _TRUE | _FALSE:
            return raw.lower() in _TRUE
        raise InvalidConfigurationError(f"{where}: expected true or false, got {raw!r}")
    if isinstance(raw, bool | dict | list):
        raise InvalidConfigurationError(f"{where}: expected a single value, got {raw!r}")
    kind = a.type
    text = raw if isinstance(raw, str) else str(raw)
    try:
        value: Any = text if kind is None else kind(text)  # type: ignore[operator]
    except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
        raise InvalidConfigurationError(f"{where}: {exc}") from None
    if a.choices is not None and value not in a.choices:
        choices = ", ".join(map(str, a.choices))
        raise InvalidConfigurationError(f"{where}: {value!r} is not one of {choices}")
    return value
