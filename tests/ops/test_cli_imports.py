"""What `metactl` loads to start (issue 34: "every CLI call is slow", most of it imports).

A fresh interpreter imports the CLI's entry point, runs `main` on a command line the way
`metactl` does, and names the modules it loaded. Parsing (`metactl --help`, `metactl
COMMAND --help`) must load none of `HEAVY` (Spark and its data packages, gRPC and etcd,
Kafka's wire and clients, hypothesis, rich, structlog, the controller's and the brokers'
code, the protocol client and messages...), but for what `STILL_LOADED` allows a
command, with why, in this one place; `metactl --help` loads no command module and no
asyncio either. The commands an operator runs most, run against an address that refuses
connections, do their work up to connecting and may load what that needs (the protocol
client, structlog), never `RUNNING_NEVER` (rich, Spark, gRPC, the controller's code...).

The lazy parser `main` builds (the named command in full, the others their --help line)
must be the full one for every command, and what argparse prints and returns must not
change for odd command lines. Constants the parsers copy from heavy modules (for --help)
must equal their sources. And `log export` without the `audit` extra says how to get it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import ops.cli
from ops.cli import COMMANDS, build_parser, command_of, modules_for

REPO = Path(__file__).resolve().parents[2]

# Prefixes of modules (a package and everything under it) that parsing never loads.
HEAVY: frozenset[str] = frozenset(
    {
        # third-party: Spark and the audits' data packages, etcd, Kafka's wire and
        # clients, test tools, pretty printing, the certificates' crypto, YAML, SQLite...
        "pyspark", "py4j", "pandas", "pyarrow", "numpy", "grpc", "etcd3aio", "google.protobuf",
        "kio", "confluent_kafka", "aiokafka", "hypothesis", "rich", "pygments",
        "cryptography", "yaml", "aiosqlite", "sqlite3", "prometheus_client", "structlog",
        "msgspec", "immutables",
        # the project's code that a command runs, not its parser
        "controller", "brokers_stub", "audit", "simulation", "localcluster", "chaos",
        "eventfeed", "clients", "metadata_image", "protocol.client", "protocol.codec",
        "protocol.messages", "protocol.kafka", "metadata_log.records", "metadata_log.store",
        "metadata_log.backends", "metadata_log.batch_format",
    }
)  # fmt: skip

# What parsing COMMAND still loads of HEAVY, and why: argument definitions that live in
# modules of the code they configure (not ops/: the fix is theirs to make).
_SERVE_ARGS = frozenset(
    {
        "controller", "metadata_image", "metadata_log.records", "protocol.codec",
        "protocol.messages", "msgspec", "immutables", "structlog", "rich", "pygments",
    }
)  # fmt: skip
# `broker run`'s flags are brokers_stub.cli.add_arguments, beside the broker's code.
_BROKER_ARGS = frozenset(
    {
        "brokers_stub", "metadata_log.records", "metadata_log.batch_format", "protocol.codec",
        "protocol.messages", "msgspec", "structlog", "rich", "pygments",
    }
)  # fmt: skip
# `cluster up`'s flags are checked by localcluster.settings (pure: no process, no IO).
_CLUSTER_TOP = frozenset({"localcluster"})
STILL_LOADED: dict[str, frozenset[str]] = {
    # `controller serve`'s flags are controller.runtime.serve.add_arguments, in the module
    # that runs the service; simulate and chaos take its add_rule_mode_arguments.
    "controller": _SERVE_ARGS,
    "simulate": _SERVE_ARGS | {"simulation"},
    "chaos": _SERVE_ARGS,
    "broker": _BROKER_ARGS,
    "cluster": _CLUSTER_TOP,
}
# Other commands' modules a command's module uses (light ones: their parsers' helpers).
ALSO_IMPORTS: dict[str, set[str]] = {
    "scenario": {"ops.describe_cmds"},  # its partition lines are describe's
    "audit": {"ops.export_cmds"},  # the input options the audits share with log export
    "reassign": {"ops.lifecycle_cmds"},  # per-partition failures, reported as topics delete's
    "topics": {"ops.describe_cmds"},  # topics list|describe are describe's (add_topic_views)
}

# What a command that talks to the controller never loads, even running.
RUNNING_NEVER: frozenset[str] = frozenset(
    {
        "pyspark", "py4j", "pandas", "pyarrow", "numpy", "grpc", "etcd3aio", "kio",
        "confluent_kafka", "aiokafka", "hypothesis", "rich", "cryptography", "yaml",
        "aiosqlite", "prometheus_client", "controller", "brokers_stub", "audit",
        "simulation", "localcluster", "chaos",
    }
)  # fmt: skip

# Runs `main` as `metactl` would (output swallowed: --help and usage errors exit), then
# prints the loaded modules' names.
CHILD = """
import contextlib, io, json, sys
from ops.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        status = main(sys.argv[1:])
    except SystemExit as exc:
        status = exc.code
print(json.dumps({"status": status, "modules": sorted(sys.modules)}))
"""


def loaded(argv: list[str]) -> tuple[object, set[str]]:
    """`metactl ARGV` in a fresh interpreter: its exit status and the modules it loaded."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("METACTL_")}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *argv],
        check=False, capture_output=True, text=True, cwd=REPO, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    return out["status"], set(out["modules"])


def under(modules: set[str], prefixes: frozenset[str]) -> set[str]:
    """The prefixes that some loaded module is (or is under)."""
    return {p for p in prefixes for m in modules if m == p or m.startswith(p + ".")}


@pytest.mark.parametrize("argv", [["--help"], []], ids=["--help", "no-command"])
def test_the_top_level_help_loads_no_command_module(argv: list[str]) -> None:
    status, modules = loaded(argv)
    assert status in (0, 2)
    assert under(modules, HEAVY) == set()
    assert {m for m in modules if m.startswith("ops.")} == {"ops.cli"}
    assert "asyncio" not in modules  # nor the protocol's flags, which load it


@pytest.mark.parametrize("command", list(COMMANDS))
def test_parsing_a_command_loads_nothing_heavy(command: str) -> None:
    status, modules = loaded([command, "--help"])
    assert status == 0
    allowed = STILL_LOADED.get(command, frozenset())
    assert under(modules, HEAVY) - allowed == set(), "loaded to parse"
    # Only the command's own modules (and the CLI's helpers) are imported.
    commands = {m for m in modules if m.startswith("ops.") and m.endswith("_cmds")}
    assert commands == set(modules_for(command)) | ALSO_IMPORTS.get(command, set())


def closed_port() -> int:
    """A port nothing listens on (it was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.mark.parametrize(
    "argv",
    [
        ["describe"],
        ["brokers"],
        ["configs", "--entity-type", "topics", "--describe"],
        ["events"],
    ],
    ids=lambda argv: argv[0],
)
def test_a_command_runs_up_to_connecting_without_heavy_modules(argv: list[str]) -> None:
    address = f"127.0.0.1:{closed_port()}"
    status, modules = loaded([*argv, "--bootstrap-controller", address, "--insecure",
                              "--timeout", "0.5"])  # fmt: skip
    assert status == 5  # NETWORK_EXCEPTION: it did try to connect
    assert "protocol.client" in modules
    assert "structlog" in modules  # configured for the command's run
    assert under(modules, RUNNING_NEVER) == set()


# --- the lazy parser is the full one ------------------------------------------------------


def subtree(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple]:
    """Every (sub-)command's path and help, depth first."""
    yield path, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from subtree(sub, (*path, name))


FULL = build_parser()


def test_the_table_of_commands_is_the_parser_s() -> None:
    """COMMANDS lists every command in --help's order with its module's help line (the
    top-level --help is the same lazily), and each command's parser is the full one."""
    lazy = build_parser(["--help"])
    assert lazy.format_help() == FULL.format_help()
    top = next(a for a in FULL._actions if isinstance(a, argparse._SubParsersAction))
    assert list(top.choices) == list(COMMANDS)
    assert {a.dest: a.help for a in top._choices_actions} == {
        name: help_text for name, (help_text, _) in COMMANDS.items()
    }


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_command_s_lazy_parser_is_its_full_parser(command: str) -> None:
    def of(parser: argparse.ArgumentParser) -> list[tuple]:
        top = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return list(subtree(top.choices[command], (command,)))

    assert of(build_parser([command])) == of(FULL)


def run_parse(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[object, str, str]:
    """What argparse prints and returns (or its exit status) for `argv`."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            args, extra = parser.parse_known_args(argv)
            result: object = (sorted(k for k in vars(args) if k != "usage_parser"), extra)
        except SystemExit as exc:
            result = exc.code
    return result, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    "argv",
    [
        ["-h", "describe"],
        ["--bogus", "describe"],
        ["describe", "--bogus"],
        ["bogus"],
        ["-1", "describe"],
        ["--", "describe", "--topic", "t"],
        ["--version"],
        ["topics"],
        ["brokers", "unregister", "--help"],
        ["describe", "--topic"],
        [],
    ],
)
def test_argparse_answers_odd_command_lines_as_before(argv: list[str]) -> None:
    assert run_parse(build_parser(argv), argv) == run_parse(build_parser(), argv)


def test_the_command_a_command_line_names() -> None:
    assert command_of(["describe", "--topic", "brokers"]) == "describe"
    assert command_of(["--help"]) is None
    assert command_of(["-h", "brokers", "unregister"]) == "brokers"
    assert command_of(["--", "events"]) == "events"
    assert command_of(["--", "--help"]) is None
    assert command_of(["bogus", "describe"]) is None
    assert command_of([]) is None
    # A module that extends another's group brings the group's creator along.
    assert modules_for("brokers") == ("ops.describe_cmds", "ops.admin_cmds", "ops.lifecycle_cmds")
    assert modules_for("describe") == ("ops.describe_cmds",)
    assert modules_for("log") == ("ops.log_cmds", "ops.export_cmds")


def test_the_parsers_copies_of_constants_are_their_sources() -> None:
    import clients.data
    import clients.quorum
    import controller.runtime.describe
    import metadata_log.records
    import ops.client
    import ops.configs_cmds
    import ops.data_cmds
    import ops.describe_cmds
    import ops.features_cmds
    import ops.quorum_cmds
    import protocol.client

    assert ops.client.DEFAULT_TIMEOUT_S == protocol.client.DEFAULT_TIMEOUT_S
    assert ops.describe_cmds.PAGE_ITEMS == controller.runtime.describe.PAGE_ITEMS
    assert (
        ops.describe_cmds.RECOVERIES_WITHIN_MS == controller.runtime.describe.RECOVERIES_WITHIN_MS
    )
    assert ops.describe_cmds.NO_LEADER == metadata_log.records.NO_LEADER
    assert ops.configs_cmds.TOPIC_RESOURCE == metadata_log.records.TOPIC_RESOURCE
    assert ops.configs_cmds.BROKER_RESOURCE == metadata_log.records.BROKER_RESOURCE
    assert ops.features_cmds.ELR_FEATURE == metadata_log.records.ELR_FEATURE
    assert ops.quorum_cmds.ASK_S == clients.quorum.ASK_S
    assert clients.data.DATA_RETRY.attempts - 1 == ops.data_cmds.DEFAULT_RETRIES


# --- a lean install (`make run`: no `audit` extra) --------------------------------------

WITHOUT_PYARROW = """
import sys
sys.modules["pyarrow"] = None  # as if not installed: `import pyarrow` fails
from ops.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_log_export_without_the_audit_extra_says_how_to_get_it(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_PYARROW, "log", "export", "--data-dir",
         str(tmp_path), "--parquet", str(tmp_path / "pq")],
        check=False, capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert done.returncode == ops.cli.EXIT_USAGE, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: INVALID_CONFIG: ")
    assert "make audit" in lines[0] and ".[audit]" in lines[0]
