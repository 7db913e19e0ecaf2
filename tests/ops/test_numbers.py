"""Numbers read as Kafka reads them (issue 30, item 8), by the one reader
(`metactl.numbers`), wherever metactl takes a number from a person or a file.

* The reader against its definition: a Hypothesis property over arbitrary text, and over
  text built near the rule (signs, digits, blanks, underscores, other scripts' digits),
  against the reference `^[+-]?[0-9]+$` within Java's int after Java's trim.
* Every numeric flag of every command (`metactl ...`, `python -m brokers_stub`, the
  audits' standalone Spark) is found by walking the parsers: none is Python's `int` or
  `float` any more, and each refuses `1_0` (or `1_0.5`) as argparse's usage error naming
  the flag, exit 2, no traceback; the same flag's `METACTL_*` variable and `--config` key
  are INVALID_CONFIG.
* The numbers inside other arguments (`--feature`, `--replica-assignment`, `--config
  min.insync.replicas=`, `certs init --brokers`, `elect --partition`, `--since`) and
  inside the JSON files (`reassign`, `elect --path-to-json-file`: a bool, a float, a
  string or a number beyond Java's int as a partition or broker id).
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from metactl.errors import InvalidConfigurationError
from metactl.numbers import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    NumberFormatError,
    decimal_arg,
    int_arg,
    kafka_decimal,
    kafka_int,
    long_arg,
    parse_int,
)
from metactl.settings import resolve
from ops.cli import build_parser, main

REFERENCE = re.compile(r"^[+-]?[0-9]+$")
JAVA_BLANKS = "".join(chr(c) for c in range(0x21))


def reference(text: str) -> int | None:
    """Kafka's reading (ASCII digits only, see metactl/numbers.py), or None if refused."""
    trimmed = text.strip(JAVA_BLANKS)
    if REFERENCE.fullmatch(trimmed) is None or "\n" in trimmed:
        return None
    value = int(trimmed)
    return value if INT32_MIN <= value <= INT32_MAX else None


def ours(text: str) -> int | None:
    try:
        return kafka_int(text)
    except NumberFormatError:
        return None


NEAR = st.text(
    alphabet=st.sampled_from(
        [*"0123456789+-_ .eExX", "\t", "\n", "\x00", "\u00a0", "\u3000", "１", "٣", "²"]
    ),
    max_size=14,
)


@given(st.text(max_size=24) | NEAR | st.integers().map(str))
@example("1_0")
@example("１０")
@example("2147483647")
@example("2147483648")
@example("-2147483648")
@example("-2147483649")
@example("\t+7\n")
@example("7\n\n")
@example("\u00a07")
def test_the_reader_is_the_reference(text: str) -> None:
    assert ours(text) == reference(text)


@pytest.mark.parametrize(
    "text",
    ["1_0", "0x10", "0o7", "0b1", "１０", "٣", "²", " 1 0", "+", "-", "", " ", "+-1", "1.0",
     "1e3", "10L", "2147483648", "-2147483649", "\u00a01", "1\u3000", "٫1"],
)  # fmt: skip
def test_refused_as_kafka_refuses(text: str) -> None:
    with pytest.raises(NumberFormatError):
        kafka_int(text)
    with pytest.raises(InvalidConfigurationError, match=r"INVALID_CONFIG: x: "):
        parse_int(text, "x")


@pytest.mark.parametrize(
    ("text", "value"),
    [("0", 0), ("+5", 5), ("-5", -5), ("007", 7), (" 7\t", 7), ("\x007\x1f", 7),
     ("2147483647", INT32_MAX), ("-2147483648", INT32_MIN)],
)  # fmt: skip
def test_taken_as_kafka_takes(text: str, value: int) -> None:
    assert kafka_int(text) == value


def test_long_range() -> None:
    assert kafka_int("9223372036854775807", maximum=INT64_MAX) == INT64_MAX
    with pytest.raises(NumberFormatError, match="out of range"):
        kafka_int("9223372036854775808", maximum=INT64_MAX)


@pytest.mark.parametrize(
    "text",
    ["1_0.5", "inf", "-inf", "nan", "NaN", "Infinity", "0x1p3", "1e999", "1.5d", "1.5f",
     "１.5", ".", "e3", "1e", "1e+", "", "+", "1..2", "1.2.3", "1,5"],
)  # fmt: skip
def test_decimal_refusals(text: str) -> None:
    with pytest.raises(NumberFormatError):
        kafka_decimal(text)


@pytest.mark.parametrize(
    ("text", "value"),
    [("1", 1.0), ("1.", 1.0), (".5", 0.5), ("+0.25", 0.25), ("-2.5", -2.5), ("1e3", 1000.0),
     ("2.5E-1", 0.25), (" 3 ", 3.0)],
)  # fmt: skip
def test_decimals_taken(text: str, value: float) -> None:
    assert math.isclose(kafka_decimal(text), value)


# --- every numeric flag ---------------------------------------------------------------------

NUMERIC = {int_arg: "1_0", long_arg: "1_0", decimal_arg: "1_0.5"}


def walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if sub is not parser:
                    yield from walk(sub, (*path, name))
        else:
            yield path, parser, action


def brokers_stub_parser() -> argparse.ArgumentParser:
    from brokers_stub.cli import add_arguments

    parser = argparse.ArgumentParser(prog="python -m brokers_stub")
    add_arguments(parser)
    return parser


def every_action() -> list[tuple[str, tuple[str, ...], argparse.ArgumentParser, argparse.Action]]:
    out = [("metactl", path, p, a) for path, p, a in walk(build_parser())]
    out += [("brokers_stub", path, p, a) for path, p, a in walk(brokers_stub_parser())]
    return out


def numeric_flags() -> list[tuple[str, tuple[str, ...], str, object]]:
    seen = set()
    out = []
    for program, path, _, a in every_action():
        if not a.option_strings or a.type is None:
            continue
        reader = a.type
        bad = NUMERIC.get(reader)  # type: ignore[call-overload]
        if bad is None and getattr(reader, "__name__", "") in ("int", "long", "decimal"):
            bad = "1_0.5" if reader.__name__ == "decimal" else "1_0"  # type: ignore[attr-defined]
        if bad is None:
            continue
        key = (program, path, a.option_strings[-1])
        if key not in seen:
            seen.add(key)
            out.append((program, path, a.option_strings[-1], bad))
    return out


FLAGS = numeric_flags()


def test_no_flag_reads_with_pythons_int_or_float() -> None:
    """`type=int` takes `1_0` and `１０`; `type=float` takes `inf`, `nan` and `1_0.5`."""
    python = [
        f"{program} {' '.join(path)} {a.option_strings[-1]}"
        for program, path, _, a in every_action()
        if a.type in (int, float)
    ]
    assert python == []
    assert len(FLAGS) >= 90  # the walk found the flags (a broken walk finds none)


@pytest.mark.parametrize(
    ("program", "path", "flag", "bad"),
    FLAGS,
    ids=[f"{p}:{' '.join(c)}:{f}" for p, c, f, _ in FLAGS],
)
def test_every_numeric_flag_refuses_python_only_syntax(
    program: str, path: tuple[str, ...], flag: str, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*path, f"{flag}={bad}"]
    with pytest.raises(SystemExit) as exited:
        if program == "metactl":
            main(argv)
        else:
            brokers_stub_parser().parse_args(argv)
    _, err = capsys.readouterr()
    assert exited.value.code == 2
    assert "Traceback" not in err
    assert err.startswith("usage: "), err
    last = err.strip().splitlines()[-1]
    assert f"error: argument {flag}" in last and repr(bad) in last, last


def test_a_numeric_setting_from_the_environment_or_a_file_is_read_the_same(
    tmp_path: Path,
) -> None:
    from brokers_stub.cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    d = ["--data-dir", str(tmp_path)]
    args = parser.parse_args(["--id", "1", "--controller", "127.0.0.1:1", "--insecure", *d])
    env = {"METACTL_SESSION_TIMEOUT_MS": "9_000"}
    with pytest.raises(InvalidConfigurationError, match=r"\$METACTL_SESSION_TIMEOUT_MS: not an"):
        resolve(parser, args, env)
    config = tmp_path / "broker.toml"
    config.write_text('flush-messages = "1_0"\n')
    args = parser.parse_args(["--id", "1", "--controller", "x:1", *d, "--config", str(config)])
    with pytest.raises(InvalidConfigurationError, match=r"flush-messages in .*: not an integer"):
        resolve(parser, args, {})
    config.write_text("flush-messages = 10\n")  # a TOML integer is taken
    args = parser.parse_args(["--id", "1", "--controller", "x:1", *d, "--config", str(config)])
    assert resolve(parser, args, {}).flush_messages == 10


# --- numbers inside arguments ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["features", "upgrade", "--feature", "eligible.leader.replicas.version=1_0"],
         "the level must be an integer"),
        (["features", "upgrade", "--feature", "eligible.leader.replicas.version=１"],
         "the level must be an integer"),
        (["topics", "create", "--topic", "t", "--partitions", "1", "--replication-factor",
          "1", "--config", "min.insync.replicas=1_0"], "is not a number"),
        (["topics", "create", "--topic", "t", "--partitions", "1", "--replica-assignment",
          "1_0:2"], "expected broker ids"),
        (["topics", "create", "--topic", "t", "--replica-assignment", "１:2"],
         "expected broker ids"),
        (["certs", "init", "--data-dir", "unused", "--brokers", "1,²"], "--brokers takes"),
        (["certs", "init", "--data-dir", "unused", "--brokers", "1,٣"], "--brokers takes"),
        (["elect", "--election-type", "PREFERRED", "--topic", "t", "--partition", "١"],
         "the partition's index"),
        (["elect", "--election-type", "PREFERRED", "--topic", "t", "--partition", "1_0"],
         "the partition's index"),
        (["events", "--data-dir", "unused", "--since", "１０m"], "--since"),
    ],
)  # fmt: skip
def test_numbers_inside_arguments(
    argv: list[str], words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [str(tmp_path / "d") if a == "unused" else a for a in argv]
    status = main([*argv, "--bootstrap-controller", "127.0.0.1:1", "--insecure"]
                  if argv[0] not in ("certs", "events") else argv)  # fmt: skip
    _, err = capsys.readouterr()
    assert "Traceback" not in err
    assert err.startswith("error: INVALID_CONFIG: ") and words in err, err
    assert status == 2


# --- numbers inside JSON files ---------------------------------------------------------------

BAD_JSON_NUMBERS = ["true", "false", "1.0", '"1"', "2147483648", "-2147483649", "1e0"]


@pytest.mark.parametrize("number", BAD_JSON_NUMBERS)
@pytest.mark.parametrize("where", ["partition", "replica"])
def test_a_reassignment_file_takes_only_json_integers_within_int(
    tmp_path: Path, number: str, where: str
) -> None:
    from ops.reassign_plan import read_file

    partition, replica = (number, "2") if where == "partition" else ("0", number)
    path = tmp_path / "move.json"
    path.write_text(
        f'{{"version": 1, "partitions": [{{"topic": "t", "partition": {partition}, '
        f'"replicas": [1, {replica}]}}]}}'
    )
    with pytest.raises(InvalidConfigurationError, match="--reassignment-json-file"):
        read_file(path, need_replicas=True)


@pytest.mark.parametrize("number", BAD_JSON_NUMBERS)
@pytest.mark.parametrize("where", ["partition", "replica"])
def test_an_election_file_takes_only_json_integers_within_int(
    tmp_path: Path, number: str, where: str
) -> None:
    from ops.admin_cmds import _from_json

    partition, replica = (number, "2") if where == "partition" else ("0", number)
    path = tmp_path / "elect.json"
    path.write_text(
        f'{{"partitions": [{{"topic": "t", "partition": {partition}, "replica": {replica}}}]}}'
    )
    with pytest.raises(InvalidConfigurationError, match="--path-to-json-file"):
        _from_json(path)


def test_good_json_files_are_still_read(tmp_path: Path) -> None:
    from ops.admin_cmds import _from_json
    from ops.reassign_plan import read_file

    path = tmp_path / "f.json"
    path.write_text(
        '{"version": 1, "partitions": [{"topic": "t", "partition": 2147483647, '
        '"replicas": [0, 2147483647]}]}'
    )
    assert read_file(path, need_replicas=True)[0].replicas == [0, INT32_MAX]
    path.write_text('{"partitions": [{"topic": "t", "partition": 0, "replica": 3}]}')
    assert _from_json(path) == [(("t", 0), 3)]
