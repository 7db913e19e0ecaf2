"""Every command's failures against the one exit-status table (issue 22: "one table, no
exceptions").

The table is read from docs/cli.md itself, so the doc and the code cannot drift: each
row's status and the error names it lists. Then, for every command of the parser
(walked, so that a new command without a case here fails), at least one failure: its
first stderr line must be `error: NAME: ...` (or argparse's usage, for the "usage" row),
NAME must be in the table, and the exit status must be the table's for NAME. A usage
error shows the sub-command's own usage, not the top level's (issue 22, item 4).

Most cases run in this process (`ops.cli.main`); the ones that start a server, or would
change process-wide state, run as a child process."""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ops.cli import NOT_FOUND_CODES, USAGE_CODES, build_parser, main

REPO = Path(__file__).resolve().parents[2]
CLI_DOC = REPO / "docs" / "cli.md"
SCENARIO = REPO / "simulation" / "scenarios" / "worked-5.3.3-balanced-recovery.yaml"
USAGE = "usage"  # argparse's own errors: no NAME, the table's "argparse" row
BAD = "127.0.0.1:99999"  # not an address: INVALID_CONFIG before anything is sent


def exit_table() -> dict[str, int]:
    """docs/cli.md's exit statuses: NAME -> status, for every `NAME` the table's rows
    list (and "usage" for the row of argparse's errors)."""
    text = CLI_DOC.read_text(encoding="utf-8")
    section = text[text.index("## Exit statuses") :]
    section = section[: section.index("\n## ", 1)]
    table: dict[str, int] = {}
    rows = 0
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or not cells[0].isdigit():
            continue
        rows += 1
        status = int(cells[0])
        row = " ".join(cells[1:])
        for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", row):
            assert table.setdefault(name, status) == status, f"{name} in two rows"
        if "argparse" in row:
            table[USAGE] = status
    assert rows >= 8, f"the table in {CLI_DOC} was not found or not parsed"
    return table


TABLE = exit_table()


def closed_port() -> str:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return f"127.0.0.1:{s.getsockname()[1]}"


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    name: str  # the expected error name, or USAGE
    child: bool = False  # run as a child process (it starts a server)
    busy_port: bool = False  # {busy} in argv: a port something listens on
    logs: bool = False  # a server: its JSON log lines come first on stderr, then its error


NET = ("--insecure", "--timeout", "1")

# Every command (a leaf of the parser, and `brokers`, a command with sub-commands) and
# one way it fails. {data}: a cluster's data directory holding a scenario's log; {empty}:
# an empty directory; {tmp}: a fresh path; {busy}: a port in use; {closed}: a closed port.
CASES: dict[str, Case] = {
    "log dump": Case(("log", "dump", "--data-dir", "{empty}"), "LOG_DIR_NOT_FOUND"),
    "log verify": Case(("log", "verify", "--data-dir", "{empty}"), "LOG_DIR_NOT_FOUND"),
    "log tail": Case(("log", "tail", "--data-dir", "{empty}"), "LOG_DIR_NOT_FOUND"),
    "log mirror": Case(
        ("log", "mirror", "--data-dir", "{empty}", "--to", "{tmp}"), "LOG_DIR_NOT_FOUND"
    ),
    "log export": Case(
        ("log", "export", "--data-dir", "{empty}", "--parquet", "{tmp}"), "LOG_DIR_NOT_FOUND"
    ),
    "scenario run": Case(("scenario", "run", "{tmp}"), "ENOENT"),
    "controller serve": Case(
        ("controller", "serve", "--data-dir", "{tmp}", "--listen", "{busy}", "--insecure"),
        "LISTEN_FAILED",
        child=True,
        busy_port=True,
        logs=True,
    ),
    "broker run": Case(
        (
            "broker",
            "run",
            "--id",
            "1",
            "--controller",
            "{closed}",
            "--data-dir",
            "{tmp}",
            "--metrics",
            "{busy}",
            "--insecure",
        ),
        "LISTEN_FAILED",
        child=True,
        busy_port=True,
        logs=True,
    ),
    "broker start": Case(
        ("broker", "start", "--id", "1", "--data-dir", "{empty}"), "NETWORK_EXCEPTION"
    ),
    "controller start": Case(
        ("controller", "start", "--node-id", "c2", "--data-dir", "{empty}"), "NETWORK_EXCEPTION"
    ),
    "describe": Case(
        ("describe", "--topic", "nosuch", "--data-dir", "{data}"), "UNKNOWN_TOPIC_OR_PARTITION"
    ),
    "brokers": Case(("brokers", "--data-dir", "{empty}"), "LOG_DIR_NOT_FOUND"),
    "brokers unregister": Case(
        ("brokers", "unregister", "--id", "1", "--bootstrap-controller", BAD, *NET),
        "INVALID_CONFIG",
    ),
    "plan restart": Case(
        ("plan", "restart", "--broker", "1", "--bootstrap-controller", BAD, *NET),
        "INVALID_CONFIG",
    ),
    "plan roll": Case(("plan", "roll", "--bootstrap-controller", BAD, *NET), "INVALID_CONFIG"),
    "roll": Case(("roll", "--data-dir", "{empty}"), "NETWORK_EXCEPTION"),  # no cluster up there
    "topics create": Case(
        ("topics", "create", "--topic", "t", "--config", "no.such.key=1", *NET), "INVALID_CONFIG"
    ),
    "topics delete": Case(
        ("topics", "delete", "--topic", "t", "--bootstrap-controller", "{closed}", *NET),
        "NETWORK_EXCEPTION",
    ),
    "topics alter": Case(("topics", "alter", "--topic", "t", "--bogus"), USAGE),
    "topics list": Case(("topics", "list", "--data-dir", "{empty}"), "LOG_DIR_NOT_FOUND"),
    "topics describe": Case(
        ("topics", "describe", "--topic", "nosuch", "--data-dir", "{data}"),
        "UNKNOWN_TOPIC_OR_PARTITION",
    ),
    "elect": Case(
        ("elect", "--election-type", "unclean", "--topic", "t", "--partition", "0", *NET),
        "INVALID_CONFIG",
    ),
    "configs": Case(
        (
            "configs",
            "--entity-type",
            "topics",
            "--entity-name",
            "t",
            "--alter",
            "--add-config",
            "min.insync.replicas",
            *NET,
        ),
        "INVALID_CONFIG",
    ),
    "features describe": Case(
        ("features", "describe", "--bootstrap-controller", "{closed}", *NET), "NETWORK_EXCEPTION"
    ),
    "features upgrade": Case(
        ("features", "upgrade", "--feature", "x=1", "--bootstrap-controller", BAD, *NET),
        "INVALID_CONFIG",
    ),
    "features downgrade": Case(("features", "downgrade"), USAGE),
    "reassign": Case(
        ("reassign", "--reassignment-json-file", "{tmp}", "--execute", *NET), "ENOENT"
    ),
    "events": Case(
        ("events", "--since", "yesterday-ish", "--data-dir", "{data}"), "INVALID_CONFIG"
    ),
    "cluster up": Case(
        (
            "cluster",
            "up",
            "--data-dir",
            "{tmp}",
            "--insecure",
            "--listen",
            "{busy}",
            "--metrics",
            "127.0.0.1:0",
            "--brokers",
            "1",
        ),
        "LISTEN_FAILED",  # found before anything starts, naming --listen
        child=True,
        busy_port=True,
    ),
    "certs init": Case(
        ("certs", "init", "--data-dir", "{tmp}", "--brokers", "1,-2"), "INVALID_CONFIG"
    ),
    "storage format": Case(
        ("storage", "format", "--data-dir", "{data}/controller"), "STORAGE_ALREADY_FORMATTED"
    ),
    "storage info": Case(("storage", "info", "--data-dir", "{tmp}"), "LOG_DIR_NOT_FOUND"),
    "storage random-uuid": Case(("storage", "random-uuid", "--bogus"), USAGE),
    "quorum describe": Case(
        ("quorum", "describe", "--status", "--bootstrap-controller", BAD, *NET), "INVALID_CONFIG"
    ),
    "quorum remove": Case(  # a SQLite data directory: only etcd logs record controllers
        ("quorum", "remove", "--node", "c1", "--data-dir", "{empty}"), "INVALID_CONFIG"
    ),
    "audit elections": Case(("audit", "elections", "--data-dir", "{empty}"), "LOG_DIR_NOT_FOUND"),
    "audit unclean-recoveries": Case(
        ("audit", "unclean-recoveries", "--data-dir", "{empty}"), "LOG_DIR_NOT_FOUND"
    ),
    "audit offline": Case(("audit", "offline", "--parquet", "{tmp}"), "ENOENT"),
    "audit brokers": Case(
        ("audit", "brokers", "--data-dir", "{data}", "--flap-window", "0"), "INVALID_CONFIG"
    ),
    "audit invariants": Case(("audit", "invariants", "--data-dir", "{empty}"), "LOG_DIR_NOT_FOUND"),
    "audit all": Case(("audit", "all", "--data-dir", "{empty}"), "LOG_DIR_NOT_FOUND"),
    "simulate history": Case(
        ("simulate", "history", "--days", "0", "--out", "{tmp}"), "INVALID_CONFIG"
    ),
    "simulate faults": Case(("simulate", "faults", "--schedules", "0"), "INVALID_CONFIG"),
    "produce": Case(
        (
            "produce",
            "--topic",
            "t",
            "--count",
            "1",
            "--acked-log",
            "{tmp}",
            "--bootstrap-controller",
            "{closed}",
            *NET,
        ),
        "NETWORK_EXCEPTION",
    ),
    "consume": Case(("consume", "--topic", "t", "--check-acked", "{tmp}", *NET), "ENOENT"),
    "chaos run": Case(("chaos", "run", "--duration", "-1"), "INVALID_CONFIG"),
}


def commands() -> Iterator[str]:
    """Every command a user can run: the parser's leaves, and a group that is a command
    of its own too (`brokers`)."""

    def walk(p: argparse.ArgumentParser, path: tuple[str, ...]) -> Iterator[str]:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if path and (not subs or p.get_default("func") is not None):
            yield " ".join(path)
        for action in subs:
            for name, sub in action.choices.items():
                yield from walk(sub, (*path, name))

    return walk(build_parser(), ())


def test_every_command_has_a_failure_case_and_the_codes_agree_with_the_table() -> None:
    missing = sorted(set(commands()) - set(CASES))
    assert missing == [], f"commands without a failure case in {__file__}: {missing}"
    # The code's own lists (ops/cli.py) against the doc's table.
    for code in USAGE_CODES:
        assert TABLE.get(code) == 2, f"{code}: docs/cli.md must list it under 2"
    for code in NOT_FOUND_CODES:
        assert TABLE.get(code) == 4, f"{code}: docs/cli.md must list it under 4"
    assert TABLE[USAGE] == 2


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("exit-table") / "data"
    assert main(["scenario", "run", str(SCENARIO), "--data-dir", str(d)]) == 0
    assert main(["storage", "format", "--data-dir", str(d / "controller")]) == 0
    return d


@pytest.mark.parametrize(
    "command",
    [pytest.param(c, marks=[pytest.mark.slow] if CASES[c].child else []) for c in sorted(CASES)],
)
def test_a_failure_has_the_tables_name_and_status(
    command: str, data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    case = CASES[command]
    empty = tmp_path / "empty"
    empty.mkdir()
    busy = socket.create_server(("127.0.0.1", 0)) if case.busy_port else None
    values = {
        "data": str(data),
        "empty": str(empty),
        "tmp": str(tmp_path / "fresh"),
        "closed": closed_port(),
        "busy": f"127.0.0.1:{busy.getsockname()[1]}" if busy is not None else "",
    }
    argv = [a.format(**values) for a in case.argv]
    try:
        if case.child:
            r = subprocess.run(
                [sys.executable, "-m", "ops.cli", *argv],
                capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
                env={**os.environ, "PYTHONPATH": str(REPO)},
            )  # fmt: skip
            status, err = r.returncode, r.stderr
        else:
            capsys.readouterr()
            try:
                status = main(argv)
            except SystemExit as exc:  # argparse's usage errors
                status = int(exc.code or 0)
            err = capsys.readouterr().err
    finally:
        if busy is not None:
            busy.close()
    assert "Traceback" not in err, err
    lines = err.splitlines()
    if case.logs:
        lines = [line for line in lines if not line.startswith("{")]
    assert lines, f"{command}: nothing on stderr (status {status})"
    if case.name == USAGE:
        # The sub-command's own usage (issue 22), then argparse's error line.
        assert lines[0].startswith(f"usage: metactl {command} "), lines[0]
        name = USAGE
    else:
        found = re.match(r"error: ([A-Z][A-Z0-9_]+): \S", lines[0])
        assert found is not None, f"{command}: not one named error line: {lines[0]!r}"
        name = found.group(1)
    assert name == case.name, f"{command}: {lines[0]}"
    assert name in TABLE, f"{name} ({command}) is not in the table of {CLI_DOC}"
    assert status == TABLE[name], f"{command}: {name} exits {status}, the table says {TABLE[name]}"


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["describe", "--bogus"], "usage: metactl describe [-h] "),
        (["brokers", "unregister", "--id", "1", "--x"], "usage: metactl brokers unregister [-h]"),
        (["log", "dump", "--data-dir", "d", "--zz"], "usage: metactl log dump [-h] "),
        (["--bogus"], "usage: metactl [-h] "),  # no command: the top level's
    ],
)
def test_an_unrecognized_argument_shows_the_commands_own_usage(
    argv: list[str], usage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage), err
    assert err.rstrip().endswith(f"error: unrecognized arguments: {argv[-1]}")
