"""Help, walked over the whole parser: every command's --help ends with examples, and
every option has help that states its default (an option whose default is None, False
or empty says what it does instead, or that it is required)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from metactl.settings import NotGiven
from ops.cli import build_parser


def parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    def walk(
        p: argparse.ArgumentParser, path: tuple[str, ...]
    ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
        yield " ".join(path) or "metactl", p
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, (*path, name))

    return walk(build_parser(), ())


def problems(p: argparse.ArgumentParser) -> list[str]:
    found = []
    if not (p.epilog and "Examples:" in p.epilog):
        found.append("no 'Examples:' epilog")
    elif not isinstance(p.formatter_class, type) or not issubclass(
        p.formatter_class, argparse.RawDescriptionHelpFormatter
    ):
        found.append("examples would be re-wrapped (not RawDescriptionHelpFormatter)")
    for a in p._actions:
        if isinstance(
            a, argparse._HelpAction | argparse._SubParsersAction | argparse._VersionAction
        ):
            continue
        if a.help == argparse.SUPPRESS:
            continue
        name = "/".join(a.option_strings) or a.dest
        default = a.default.value if isinstance(a.default, NotGiven) else a.default
        if not a.help:
            found.append(f"{name}: no help")
        elif (
            default not in (None, False, [], "")
            and not a.required
            and "default" not in a.help.lower()
        ):
            found.append(f"{name}: the help does not state the default {default!r}")
    return found


ALL = list(parsers())


@pytest.mark.parametrize("path", [path for path, _ in ALL])
def test_every_command_has_examples_and_every_option_help_with_its_default(path: str) -> None:
    parser = dict(ALL)[path]
    assert problems(parser) == []


def test_the_walk_sees_every_command() -> None:
    paths = {path for path, _ in ALL}
    for expected in (
        "describe", "brokers", "elect", "topics create", "events", "log dump", "log tail",
        "scenario run", "simulate history", "simulate faults", "produce", "consume",
        "controller serve", "broker run", "cluster up",
    ):  # fmt: skip
        assert expected in paths


def test_the_checker_catches_a_missing_help_and_an_unstated_default() -> None:
    p = argparse.ArgumentParser(
        epilog="Examples:\n  x", formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--a", default=3, help="something")
    p.add_argument("--b")
    assert problems(p) == [
        "--a: the help does not state the default 3",
        "--b: no help",
    ]
    assert problems(argparse.ArgumentParser()) == ["no 'Examples:' epilog"]


def test_help_shows_examples_one_per_line(capsys: pytest.CaptureFixture[str]) -> None:
    parser = dict(ALL)["describe"]
    text = parser.format_help()
    tail = text[text.index("Examples:") :].splitlines()
    assert tail[1].strip() == "metactl describe"
    assert all(line.startswith("  metactl ") for line in tail[1:] if line)


@pytest.mark.parametrize(
    "argv",
    [
        ["describe", "--bootstrap-server", "127.0.0.1:9092"],
        ["topics", "create", "--topic", "t", "--bootstrap-server=127.0.0.1:9092"],
    ],
)
def test_a_kafka_bootstrap_server_flag_gets_one_line_naming_ours(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from ops.cli import EXIT_USAGE, main

    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "usage:" not in err
    assert (
        err.startswith("error: INVALID_CONFIG: --bootstrap-server")
        and "--bootstrap-controller" in err
    )
