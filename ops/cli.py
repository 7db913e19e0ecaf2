"""Entry point of the `metactl` command: builds the argument parser from command modules.

Each command module exposes `register(subparsers)`, which adds its sub-commands and sets
`func` on them; `func(args)` returns the exit status. Start-up stays cheap (issue 34: an
operator runs dozens of commands): `metactl COMMAND ...` imports only the modules that
add to COMMAND (`COMMANDS`), the other commands are their --help line alone, and a
command module imports its implementation (the protocol client, the controller's code,
Spark) when its command runs, not to build its parser. `metactl --help` imports no
command module. tests/ops/test_cli_imports.py holds what a parse may load.

Every failure ends as one line on stderr, `error: NAME: message`, and an exit status
from the one table below (docs/cli.md): a command raises its named error (or returns a
status of its own verdicts, e.g. `scenario run`'s failed expectation) and `main` maps
what escapes. Ctrl-C ends any command with 130 and no traceback.

Kafka's habits (issue 34; docs/cli.md, Coming from Kafka): `kafka_order` rewrites
Kafka's argument orders before parsing (`topics --describe` is `topics describe`, a
sub-command's options may come before it: `quorum --bootstrap-controller H:P describe`),
and a usage error caused by a Kafka flag metactl spells differently, or lacks, is one
line saying what to use instead (`KAFKA_FLAGS`, the one table of them) rather than
argparse's usage. This module decides no command's meaning: it only reorders and names.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType


def _interrupted_while_starting(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(130)  # EXIT_INTERRUPTED, silently


# The `metactl` command (or `python -m ops.cli`): a Ctrl-C before `main` guards it, while
# the imports below run (a few ms: structlog loads once the command is parsed), ends it
# with 130 and no traceback too. `main` puts Python's own handler back. An ignored
# SIGINT stays ignored.
if (__name__ == "__main__" or os.path.basename(sys.argv[0]) == "metactl") and (
    signal.getsignal(signal.SIGINT) is signal.default_int_handler
):
    signal.signal(signal.SIGINT, _interrupted_while_starting)

import argparse  # noqa: E402
import errno  # noqa: E402
import importlib  # noqa: E402
import logging  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from contextvars import ContextVar  # noqa: E402
from typing import Final, NoReturn  # noqa: E402

from metactl import __version__  # noqa: E402
from metactl.errors import InvalidConfigurationError, MetactlError, details_of  # noqa: E402
from metactl.logs import configure as configure_logs  # noqa: E402

# --- exit statuses: one table for every command (docs/cli.md) -----------------------------

EXIT_OK: Final = 0
EXIT_REFUSED: Final = 1  # a named error: the controller, the log or a check said no
EXIT_USAGE: Final = 2  # bad arguments or configuration (argparse's own status)
# 3 is a command's own verdict where it has one (`simulate faults`: a silent loss).
EXIT_NOT_FOUND: Final = 4  # no such topic, partition, broker, log or file
EXIT_UNAVAILABLE: Final = 5  # no answer (in time), or a retriable error outlasted the retries
EXIT_INTERNAL: Final = 70  # a bug (EX_SOFTWARE): please report it
EXIT_INTERRUPTED: Final = 130  # Ctrl-C (128 + SIGINT)

USAGE_CODES: Final = frozenset({"INVALID_CONFIG", "INVALID_SCENARIO"})
NOT_FOUND_CODES: Final = frozenset(
    {
        "UNKNOWN_TOPIC_OR_PARTITION",
        "BROKER_ID_NOT_REGISTERED",
        "LOG_DIR_NOT_FOUND",
        "JAVA_NOT_FOUND",  # a program the command needs is not installed (`make system`)
        "PYSPARK_NOT_FOUND",  # the audits' optional packages are not installed (`make audit`)
    }
)


def exit_status(exc: BaseException) -> int:
    """The table's status for a failure."""
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, MetactlError):
        if exc.code in USAGE_CODES:
            return EXIT_USAGE
        if exc.code in NOT_FOUND_CODES:
            return EXIT_NOT_FOUND
        return EXIT_UNAVAILABLE if exc.retriable else EXIT_REFUSED
    if isinstance(exc, FileNotFoundError | NotADirectoryError):
        return EXIT_NOT_FOUND
    if isinstance(exc, TimeoutError | ConnectionError):
        return EXIT_UNAVAILABLE
    if isinstance(exc, OSError):
        return EXIT_REFUSED
    return EXIT_INTERNAL


def error_line(exc: BaseException) -> str:
    """`error: NAME: message`, on one line: NAME is the error's code (an OSError's errno
    name, e.g. ENOENT)."""
    if isinstance(exc, MetactlError):
        name, message = exc.code, exc.message
    elif isinstance(exc, OSError) and exc.errno is not None and exc.errno in errno.errorcode:
        name = errno.errorcode[exc.errno]
        message = exc.strerror or str(exc)
        if exc.filename is not None:
            message += f": {exc.filename}"
    elif isinstance(exc, TimeoutError):
        name, message = "REQUEST_TIMED_OUT", str(exc) or "timed out"
    else:
        name, message = "UNKNOWN_SERVER_ERROR", f"{type(exc).__name__}: {exc}"
    return f"error: {name}: " + " ".join((message or name).split())


def fail(exc: BaseException) -> int:
    """Print the failure's one line on stderr (then its details, if it has any); its exit
    status."""
    print(error_line(exc), file=sys.stderr, flush=True)
    for line in details_of(exc):
        print(line, file=sys.stderr, flush=True)
    return exit_status(exc)


def examples(*lines: str) -> str:
    """A command's --help epilog: `Examples:` and the given command lines."""
    return "Examples:\n" + "\n".join(f"  {line}" for line in lines)


# Keeps a command's description and epilog as written (examples stay one per line).
HELP_FORMAT: Final = argparse.RawDescriptionHelpFormatter

# Modules that contribute sub-commands, in the order they appear in --help.
COMMAND_MODULES: tuple[str, ...] = (
    "ops.log_cmds",
    "ops.export_cmds",  # adds `log export` to the `log` group, so it comes after ops.log_cmds
    "ops.scenario_cmds",
    "ops.controller_cmds",
    "ops.broker_cmds",
    "ops.describe_cmds",  # describe, brokers
    "ops.admin_cmds",  # topics create, elect
    # topics delete|alter, brokers unregister: after the groups they extend (above)
    "ops.lifecycle_cmds",
    "ops.configs_cmds",
    "ops.features_cmds",
    "ops.reassign_cmds",
    "ops.events_cmds",
    "ops.cluster_cmds",
    "ops.certs_cmds",
    "ops.storage_cmds",
    "ops.quorum_cmds",
    "ops.audit_cmds",
    "ops.simulate_cmds",
    "ops.data_cmds",
    "ops.chaos_cmds",
    "ops.plan_cmds",
    "ops.roll_cmds",
)

# The top-level commands, in --help's order: each one's help line, as its module gives it
# (tests/ops/test_cli_imports.py checks that they agree), and the modules that add to it,
# the one that creates it first. `metactl COMMAND` imports these modules only; the other
# commands are parsers with their help line alone, which nothing parses with.
COMMANDS: Final[dict[str, tuple[str, tuple[str, ...]]]] = {
    "log": ("inspect the durable metadata log", ("ops.log_cmds", "ops.export_cmds")),
    "scenario": ("run what-if scenarios on the real controller core", ("ops.scenario_cmds",)),
    "controller": (
        "run the controller service, or bring one of `cluster up` back",
        ("ops.controller_cmds",),
    ),
    "broker": ("run a stub broker, or bring one of `cluster up` back", ("ops.broker_cmds",)),
    "describe": ("topics and partitions, like kafka-topics --describe", ("ops.describe_cmds",)),
    "brokers": (
        "registered brokers and their state",
        ("ops.describe_cmds", "ops.lifecycle_cmds"),
    ),
    "topics": (
        "list, describe, create, alter and delete topics, like kafka-topics.sh",
        ("ops.admin_cmds", "ops.lifecycle_cmds"),
    ),
    "elect": ("leader elections, like kafka-leader-election.sh", ("ops.admin_cmds",)),
    "configs": ("describe and alter dynamic configs, like kafka-configs.sh", ("ops.configs_cmds",)),
    "features": (
        "describe and change feature levels, like kafka-features.sh",
        ("ops.features_cmds",),
    ),
    "reassign": (
        "move partitions' replicas, like kafka-reassign-partitions.sh",
        ("ops.reassign_cmds",),
    ),
    "events": (
        "the committed log as one readable line per event (fences, leaders, recoveries)",
        ("ops.events_cmds",),
    ),
    "cluster": ("local clusters", ("ops.cluster_cmds",)),
    "certs": ("the cluster's certificate authority and certificates", ("ops.certs_cmds",)),
    "storage": (
        "format a data directory, or show its identity (as kafka-storage)",
        ("ops.storage_cmds",),
    ),
    "quorum": ("the controller quorum, like kafka-metadata-quorum", ("ops.quorum_cmds",)),
    "audit": ("Spark audits of the election history in metadata logs", ("ops.audit_cmds",)),
    "simulate": ("simulate long cluster histories into a metadata log", ("ops.simulate_cmds",)),
    "produce": (
        "produce records to a topic and log every acknowledged batch",
        ("ops.data_cmds",),
    ),
    "consume": ("read the committed records of a topic from the leaders", ("ops.data_cmds",)),
    "chaos": ("fault injection with real processes", ("ops.chaos_cmds",)),
    "plan": ("pre-flight: what a broker's restart or a roll would do", ("ops.plan_cmds",)),
    "roll": ("restart `cluster up`'s brokers one at a time, keeping MinISR", ("ops.roll_cmds",)),
}


def command_of(argv: Sequence[str]) -> str | None:
    """The command `argv` runs, if it names one of `COMMANDS`: its first argument that is
    no option (after `--`, the one after it). The top-level options take no value, so
    this is the argument argparse hands to the command's parser; when it is something
    else, argparse reports an error with the top-level parser, the same in every build."""
    at = _command_at(argv)
    return None if at is None else argv[at]


def _command_at(argv: Sequence[str]) -> int | None:
    """Where `command_of`'s command is in `argv`."""
    for i, arg in enumerate(argv):
        if arg == "--":
            return i + 1 if i + 1 < len(argv) and argv[i + 1] in COMMANDS else None
        if not arg.startswith("-"):
            return i if arg in COMMANDS else None
    return None


def modules_for(command: str) -> tuple[str, ...]:
    """The modules `metactl COMMAND` imports, in `COMMAND_MODULES` order: those that add to
    it, and the ones that create every other group these add to (`ops.lifecycle_cmds`
    extends `topics` and `brokers`: `brokers` needs `ops.admin_cmds` too)."""
    wanted = set(COMMANDS[command][1])
    while True:
        creators = {modules[0] for _, modules in COMMANDS.values() if wanted.intersection(modules)}
        if creators <= wanted:
            return tuple(m for m in COMMAND_MODULES if m in wanted)
        wanted |= creators


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command; or, given `argv`, the one `main` parses it with: the
    command `argv` names in full (`command_of`, `modules_for`) and every other command its
    --help line only. Same top-level help and errors, same parser for that command's
    arguments, without importing the other commands' modules (`metactl --help`: none)."""
    parser = MetactlParser(
        prog="metactl",
        description="metactl: a KIP-966 controller metadata service and its tools",
        epilog=examples(
            "metactl describe --bootstrap-controller 127.0.0.1:9093",
            "metactl events --follow --since 10m",
            "metactl COMMAND --help",
        )
        + "\n\nExit status: 0 ok, 1 refused, 2 usage, 4 not found, 5 unavailable, "
        "130 interrupted (docs/cli.md).",
        formatter_class=HELP_FORMAT,
    )
    parser.add_argument("--version", action="version", version=f"metactl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = COMMAND_MODULES
    if argv is not None:
        command = command_of(argv)
        chosen = () if command is None else modules_for(command)
    for name in COMMAND_MODULES:
        if name in chosen:
            try:
                module = importlib.import_module(name)
            except ModuleNotFoundError as exc:
                if exc.name == name:
                    continue  # a command module not written yet
                raise
            module.register(sub)
        elif argv is not None:
            for cmd, (help_text, modules) in COMMANDS.items():
                if modules[0] == name and cmd not in sub.choices:
                    sub.add_parser(cmd, help=help_text)  # its line in --help, and a choice
    _mark_usage(parser)
    return parser


def _mark_usage(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> None:
    """Every (sub-)command's parser records itself as `usage_parser`: the deepest one
    chosen wins (a sub-command's defaults are applied after its parent's), so a usage
    error is reported with the sub-command's usage, not the top level's (issue 22). Each
    also records its command's path, the scope of its `KAFKA_FLAGS`."""
    parser.set_defaults(usage_parser=parser)
    if isinstance(parser, MetactlParser):
        parser.command_path = path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if name in {a.dest for a in action._choices_actions}:  # not an alias
                    _mark_usage(sub, (*path, name))


# --- Kafka's habits (issue 34; docs/cli.md, Coming from Kafka) ----------------------------

_CLIENT_CONFIG = (
    "metactl reads no client properties: certificates come from --tls-dir DIR (or "
    "$METACTL_TLS_DIR), the principal from --principal NAME; --insecure for none"
)
_ENTITIES = "metactl's configs are topics' and the cluster default's (--entity-type topics|brokers)"
_FEATURE_LEVELS = "`metactl features describe` shows each feature's supported and finalized levels"
_NO_METADATA_VERSION = (
    "metactl has no metadata.version; its one feature, eligible.leader.replicas.version, a "
    "new cluster takes from `controller serve --eligible-leader-replicas`, a running one "
    "changes with `metactl features upgrade|downgrade --feature NAME=LEVEL`"
)
_QUORUM_IS_ETCD = (
    "metactl's controller quorum is its etcd log: a controller joins by starting on the same "
    "--metadata-log etcd://HOST:PORT/PREFIX (docs/ha.md), nothing to format for it"
)
_DECODED = "`metactl log dump` decodes every record in full (--json: every field): leave it out"
_NOT_METADATA = (
    "metactl's log holds metadata records only, which `metactl log dump` decodes; a topic's "
    "records are `metactl consume --topic T`"
)
# Kafka's spellings that metactl takes otherwise, or not at all: (the command they may
# follow, "" for any; the flags, or Kafka sub-command names; what to use instead). Only
# a usage error looks here, and only at what the failing parser does not take.
KAFKA_HABITS: Final[tuple[tuple[str, tuple[str, ...], str], ...]] = (
    ("", ("--bootstrap-server",), "metactl talks to the controller: use --bootstrap-controller "
     "HOST:PORT[,HOST:PORT...] (KIP-919; default 127.0.0.1:9093)"),
    ("", ("--command-config", "--admin.config"), _CLIENT_CONFIG),
    ("", ("--zookeeper",), "metactl has no ZooKeeper: use --bootstrap-controller HOST:PORT"),
    ("topics", ("--topic-id",), "name the topic: --topic T (`metactl topics describe` prints "
     "each TopicId)"),
    ("topics", ("--topics-with-overrides",), "`metactl configs --entity-type topics "
     "--describe` lists every topic's configs"),
    ("topics", ("--exclude-internal",), "metactl has no internal topics: leave it out"),
    ("topics", ("--config",), "a topic's configs change with `metactl configs --entity-type "
     "topics --entity-name T --alter --add-config K=V` (`topics create` takes --config K=V)"),
    ("topics", ("--delete-config",), "use `metactl configs --entity-type topics --entity-name "
     "T --alter --delete-config K`"),
    ("topics", ("--disable-rack-aware",), "the controller's placement alternates racks; "
     "place replicas yourself with --replica-assignment 1:2:3,2:3:1"),
    ("topics", ("--partition-size-limit-per-response",), "use --page-size N"),
    ("topics alter", ("--replication-factor",), "a replication factor changes by "
     "reassignment: `metactl reassign --reassignment-json-file F --execute`"),
    ("configs", ("--topic",), "use --entity-type topics --entity-name T"),
    ("configs", ("--broker",), "use --entity-type brokers --entity-name ID"),
    ("configs", ("--broker-defaults",), "use --entity-type brokers --entity-default"),
    ("configs", ("--add-config-file",), "give the configs inline: --add-config K=V[,K=V]"),
    ("configs", ("--all",), "--describe lists every config metactl has, with its source"),
    ("configs", ("--force",), "metactl asks no questions: leave it out"),
    ("configs", ("--user", "--user-defaults", "--client", "--client-defaults", "--ip",
                 "--group", "--client-metrics", "--broker-logger"), _ENTITIES),
    ("reassign", ("--throttle", "--replica-alter-log-dirs-throttle", "--preserve-throttles"),
     "metactl has no replication throttles (new replicas copy at the brokers' pace, into "
     "their one log directory): leave it out"),
    ("quorum", ("--human-readable",), "metactl's times are readable already (ISO times and "
     "ages); --json gives epoch ms"),
    ("quorum", ("add-controller",), "a controller joins by starting on the same etcd log: "
     "`metactl controller serve --metadata-log etcd://HOST:PORT/PREFIX --node-id ID` "
     "(docs/ha.md)"),
    ("quorum", ("remove-controller",), "use `metactl quorum remove --controller-id ID "
     "--data-dir etcd://HOST:PORT/PREFIX` (controllers on etcd record themselves there)"),
    ("quorum", ("--controller-directory-id", "-d"), "metactl's controllers have no directory "
     "id: `metactl quorum remove --controller-id ID --data-dir etcd://HOST:PORT/PREFIX`"),
    ("quorum", ("--dry-run",), "metactl has no dry run: `metactl quorum describe "
     "--replication` shows the recorded controllers first"),
    ("storage", ("-c", "--config"), "metactl has no server.properties: name each directory "
     "with --data-dir D (repeatable) and the node with --node-id N"),
    ("storage", ("-r", "--release-version", "-f", "--feature"), _NO_METADATA_VERSION),
    ("storage", ("-s", "--standalone", "-I", "--initial-controllers", "-N",
                 "--no-initial-controllers"), _QUORUM_IS_ETCD),
    ("storage", ("-S", "--add-scram"), "metactl authenticates with TLS certificates, not "
     "SCRAM: `metactl certs init --data-dir D` makes them"),
    ("storage", ("version-mapping", "feature-dependencies"), _FEATURE_LEVELS),
    ("log", ("--print-data-log", "--deep-iteration", "--cluster-metadata-decoder"), _DECODED),
    ("log", ("--skip-record-metadata",), "each line is one record, its offset and commit "
     "time first: leave it out"),
    ("log", ("--offsets-decoder", "--transaction-log-decoder", "--share-group-state-decoder",
             "--remote-log-metadata-decoder", "--key-decoder-class", "--value-decoder-class"),
     _NOT_METADATA),
    ("log", ("--verify-index-only", "--index-sanity-check"), "`metactl log verify --data-dir "
     "D` checks every batch's CRC and the offsets"),
    ("log", ("--max-bytes", "--max-message-size"), "narrow the dump with --from OFFSET --to "
     "OFFSET"),
    ("features", ("disable",), "use `metactl features downgrade --feature NAME=0`"),
    ("features", ("version-mapping", "feature-dependencies"), _FEATURE_LEVELS),
    ("features", ("--release-version", "--metadata"), "metactl has no metadata.version: name "
     "the feature, --feature eligible.leader.replicas.version=LEVEL"),
    ("features", ("--dry-run",), "metactl has no dry run: `metactl features describe` shows "
     "the levels before you change one"),
    ("features", ("--unsafe",), "a metactl downgrade needs no --unsafe (it clears every ELR "
     "and LastKnownELR, KIP-966): leave it out"),
)  # fmt: skip
# The table by (scope, flag): what tests/ops/test_kafka_habits.py tries one by one.
KAFKA_FLAGS: Final[dict[tuple[str, str], str]] = {
    (scope, flag): advice for scope, flags, advice in KAFKA_HABITS for flag in flags
}
# Kafka's action flags that are metactl sub-commands: `topics --describe --topic T` is
# `topics describe --topic T` (kafka-topics.sh --list|--describe|--create|--alter|--delete).
ACTION_FLAGS: Final[dict[str, dict[str, str]]] = {
    "topics": {f"--{a}": a for a in ("list", "describe", "create", "alter", "delete")},
}
# The command line being parsed (`main` sets it): what `MetactlParser.error` looks at.
_PARSING: ContextVar[Sequence[str] | None] = ContextVar("metactl_parsing", default=None)


def kafka_habit(argv: Sequence[str], parser: argparse.ArgumentParser) -> MetactlError | None:
    """The first argument of `argv` that is a Kafka spelling `parser` does not take, as
    one named error saying what to use instead (`KAFKA_FLAGS`, looked up from the
    parser's own command out to every command), or None."""
    path = parser.command_path if isinstance(parser, MetactlParser) else ()
    for arg in argv:
        if arg == "--":
            break
        word = arg.split("=", 1)[0] if arg.startswith("-") else arg
        if word in parser._option_string_actions:
            continue
        for n in range(len(path), -1, -1):
            advice = KAFKA_FLAGS.get((" ".join(path[:n]), word))
            if advice is not None:
                return InvalidConfigurationError(f"{word} is Kafka's; {advice}")
    return None


class MetactlParser(argparse.ArgumentParser):
    """Every metactl (sub-)command's parser: argparse's, but a usage error that a Kafka
    habit explains is that one line (INVALID_CONFIG, status 2) instead of a usage."""

    command_path: tuple[str, ...] = ()  # e.g. ("quorum", "describe"): set by _mark_usage

    def error(self, message: str) -> NoReturn:
        argv = _PARSING.get()
        habit = None if argv is None else kafka_habit(argv, self)
        if habit is not None:
            raise habit
        super().error(message)


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:  # type: ignore[type-arg]
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _values_taken(action: argparse.Action, arg: str, following: Sequence[str]) -> int | None:
    """How many arguments after `arg` an option takes (None: not one this can tell)."""
    if "=" in arg:
        return 0
    if action.nargs is None:
        return 1
    if isinstance(action.nargs, int):
        return action.nargs
    if action.nargs == "?":
        return 1 if following and not following[0].startswith("-") else 0
    return None


def kafka_order(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """`argv` in metactl's order: a Kafka action flag (`ACTION_FLAGS`) becomes its
    sub-command, right after the command, and options of a sub-command given before it
    (`quorum --bootstrap-controller H:P describe --status`, Kafka's order) move after it.
    Anything this cannot place is left as it is, for argparse (and `KAFKA_FLAGS`) to
    report. Two action flags are INVALID_CONFIG."""
    out = list(argv)
    at = _command_at(out)
    top = _subcommands(parser)
    if at is None or top is None or out[at] not in top.choices:
        return out
    end = out.index("--", at) if "--" in out[at:] else len(out)
    actions = ACTION_FLAGS.get(out[at], {})
    given = [i for i in range(at + 1, end) if out[i] in actions]
    if len(given) > 1:
        raise InvalidConfigurationError(
            f"{' and '.join(out[i] for i in given)}: give one of {', '.join(actions)}"
        )
    if given:
        out.insert(at + 1, actions[out.pop(given[0])])
        return out
    group = top.choices[out[at]]
    subs = _subcommands(group)
    if subs is None:
        return out
    everywhere = {f: a for p in subs.choices.values() for f, a in p._option_string_actions.items()}
    i, before = at + 1, []
    while i < end and out[i].startswith("-") and out[i] != "-":
        flag = out[i].split("=", 1)[0]
        action = group._option_string_actions.get(flag) or everywhere.get(flag)
        taken = None if action is None else _values_taken(action, out[i], out[i + 1 : end])
        if taken is None:
            return out
        before.append((i, i + 1 + taken, flag))
        i += 1 + taken
    if i >= end or out[i] not in subs.choices:
        return out
    chosen = subs.choices[out[i]]
    move = [
        (a, b)
        for a, b, flag in before
        if flag not in group._option_string_actions and flag in chosen._option_string_actions
    ]
    if not move:
        return out
    moved = [arg for a, b in move for arg in out[a:b]]
    kept = [
        a for j, a in enumerate(out[at + 1 : i], at + 1) if not any(x <= j < y for x, y in move)
    ]
    return [*out[: at + 1], *kept, out[i], *moved, *out[i + 1 :]]


def main(argv: Sequence[str] | None = None) -> int:
    try:
        if signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
            # From here on, Ctrl-C is a KeyboardInterrupt, caught below.
            signal.signal(signal.SIGINT, signal.default_int_handler)
        given = sys.argv[1:] if argv is None else argv
        parser = build_parser(given)
        given = kafka_order(parser, given)
        parsing = _PARSING.set(given)  # a Kafka habit is named (MetactlParser.error)
        try:
            args, extra = parser.parse_known_args(given)
            if extra:
                # argparse would report these with the top-level usage: the sub-command's
                # own usage says what it takes (exit 2, as argparse's).
                chosen: argparse.ArgumentParser = getattr(args, "usage_parser", parser)
                chosen.error(f"unrecognized arguments: {' '.join(extra)}")
        finally:
            _PARSING.reset(parsing)
        func = getattr(args, "func", None)
        if func is None:
            # A group without its sub-command (`metactl log`): its help, a usage status.
            chosen = getattr(args, "help_parser", parser)
            chosen.print_help(sys.stderr)
            return EXIT_USAGE
        # The CLI prints its own results; library logs go to stderr, readable, warnings up
        # (configured once parsed: --help and usage errors never load structlog).
        configure_logs(json=False, level=logging.WARNING)
        if hasattr(args, "etcd_cacert"):  # --etcd-cacert/--etcd-cert/--etcd-key
            from metadata_log.etcd.tls import etcd_tls_from

            etcd_tls_from(args)  # the process's TLS to an etcd log, wherever it is opened
        status = func(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`metactl log dump | head`): not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except (MetactlError, OSError, TimeoutError) as exc:
        return fail(exc)
    except Exception as exc:  # a bug: one line, unless debugging
        if os.environ.get("METACTL_DEBUG"):
            raise
        return fail(exc)
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
