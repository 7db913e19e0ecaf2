"""`metactl log export`: a metadata log as Parquet in the audit schema (see `audit.export`).

This module adds ``export`` to the ``log`` command (registered by `ops.log_cmds`, which
must come first in `ops.cli.COMMAND_MODULES`). It also holds the input options that the
audit commands share: ``--data-dir`` (repeatable, or comma-separated) or ``--parquet``,
and checks them without Spark (`resolve_data_dirs`, `input_from_args`): a data directory
is the cluster's (``./data``) or the controller's (``./data/controller``), or a log file.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from metadata_log.etcd.tls import add_etcd_tls_arguments


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    log_parser = subparsers.choices.get("log")
    if log_parser is None:
        log_parser = subparsers.add_parser("log", help="inspect the durable metadata log")
    commands = next(
        (a for a in log_parser._actions if isinstance(a, argparse._SubParsersAction)), None
    )
    if commands is None:
        commands = log_parser.add_subparsers(
            dest="log_command", metavar="SUBCOMMAND", required=True
        )
    from ops.cli import HELP_FORMAT, examples

    export = commands.add_parser(
        "export",
        help="write the log as Parquet in the audit schema, laid out for the audits",
        description="Write every record as one row of the audit schema to a Parquet "
        "dataset in OUT: partition records in buckets (OUT/kind=partition/), the rest in "
        "OUT/kind=cluster/, and a manifest (read-only on the log; no Spark needed; a "
        "process per core). To audit on a Spark cluster, write OUT where every worker can "
        "read it.",
        epilog=examples(
            "metactl log export --data-dir ./data --parquet /tmp/pq",
            "metactl log export --data-dir /a/data,/b/data --cluster a,b --parquet /shared/pq",
        ),
        formatter_class=HELP_FORMAT,
    )
    export.add_argument(
        "--data-dir",
        action="append",
        required=True,
        help=DATA_DIR_HELP,
    )
    export.add_argument("--parquet", required=True, type=Path, help="output directory")
    export.add_argument(
        "--cluster",
        action="append",
        help="cluster name(s), one per data dir (default: the directories' names)",
    )
    export.add_argument(
        "--overwrite", action="store_true", help="replace a non-empty output (default: refuse)"
    )
    add_etcd_tls_arguments(export)
    export.set_defaults(func=_export)


DATA_DIR_HELP = (
    "the cluster's data directory (./data), the controller's (./data/controller), a log "
    "file, or an etcd log's URL (etcd://HOST:PORT/PREFIX, mirrored to a temporary SQLite "
    "file first); repeat or comma-separate for several clusters"
)


# The packages of the `audit` extra (pyproject.toml) that `log export` writes Parquet with:
# `make run` does not install them (issue 34).
EXPORT_PACKAGES = frozenset({"pyarrow", "numpy", "pandas"})


def _export(args: argparse.Namespace) -> int:
    from metactl.errors import InvalidConfigurationError

    try:
        from audit.export import export_parquet
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in EXPORT_PACKAGES:
            raise
        raise InvalidConfigurationError(
            f"log export writes Parquet with the audits' packages, and {exc.name} is not "
            "installed: run `make audit` (or `pip install -e '.[audit]'`)"
        ) from None

    given = _split(args.data_dir)
    if not given:
        raise InvalidConfigurationError("--data-dir names no data directory")
    dirs, clusters = resolve_data_dirs(given, _split(args.cluster))
    report = export_parquet(dirs, args.parquet, clusters=clusters, overwrite=args.overwrite)
    for line in report.lines():
        print(line)
    return 0


def _split(values: list[str] | None) -> list[str]:
    out: list[str] = []
    for v in values or []:
        out.extend(p.strip() for p in v.split(",") if p.strip())
    return out


def add_source_options(parser: argparse.ArgumentParser) -> None:
    """--data-dir D [--data-dir D2 ...] | --parquet P, and --cluster names."""
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--data-dir", action="append", help=DATA_DIR_HELP)
    src.add_argument(
        "--parquet",
        help="a `metactl log export` output directory (or a URL the Spark cluster reads)",
    )
    parser.add_argument(
        "--cluster",
        action="append",
        help="cluster name(s) for the data dirs (default: the directories' names)",
    )
    add_etcd_tls_arguments(parser)


def resolve_data_dirs(given: list[str], clusters: list[str]) -> tuple[list[str], list[str]]:
    """The log of each given path (`ops.paths.resolve_log_dir`; a log file stays as
    given), checked to be a metactl log, and the cluster names: the given ones, else
    each path's name as typed (``./data`` is ``data``, not ``controller``), else, when
    two names clash, the full paths. Raises LOG_DIR_NOT_FOUND naming the places tried,
    and INVALID_CONFIG unless the names are distinct, one per path."""
    from audit.logread import cluster_name, log_info
    from metactl.errors import InvalidConfigurationError
    from metadata_log.backends import is_etcd_url
    from ops.paths import resolve_log_dir

    if given and clusters and len(clusters) != len(given):
        raise InvalidConfigurationError(
            f"--cluster names {len(clusters)} cluster(s) for {len(given)} data "
            "directories: give one name per data directory"
        )
    dirs = []
    for path in given:
        if is_etcd_url(path):
            found = _mirrored(path)  # the audits read SQLite log files
        else:
            found = Path(path) if Path(path).is_file() else resolve_log_dir(path)
        log_info(found)  # a metactl log, of a schema this reader knows
        dirs.append(str(found))
    names = clusters or [
        p.rstrip("/").rsplit("/", 1)[-1] if is_etcd_url(p) else cluster_name(p) for p in given
    ]
    if not clusters and len(set(names)) != len(names):
        names = [str(Path(p).resolve()) for p in given]
    if given and len(set(names)) != len(names):
        raise InvalidConfigurationError(f"cluster names must be distinct, got {names}")
    return dirs, names


def _mirrored(url: str) -> Path:
    """A SQLite mirror of the etcd log at `url` (`metadata_log.mirror`), in a temporary
    directory removed when the process exits."""
    import asyncio
    import atexit
    import shutil
    import tempfile

    from metadata_log.mirror import mirror_to_sqlite
    from ops.paths import open_log

    out = Path(tempfile.mkdtemp(prefix="metactl-mirror-"))
    atexit.register(shutil.rmtree, out, True)

    async def copy() -> Path:
        async with await open_log(url) as store:
            return Path((await mirror_to_sqlite(store, out)).path)

    return asyncio.run(copy())


def input_from_args(args: argparse.Namespace, since: str | None, until: str | None) -> Any:
    """The audit's input, every path checked (see `resolve_data_dirs`; a Parquet export
    must exist, unless it is a URL such as hdfs://...). No Spark here: a bad path fails
    before the session starts."""
    import errno
    from urllib.parse import urlsplit

    from audit.spark import AuditInput

    dirs, clusters = resolve_data_dirs(_split(args.data_dir), _split(args.cluster))
    if args.parquet is not None:
        url = urlsplit(args.parquet)
        local = Path(url.path) if url.scheme == "file" else Path(args.parquet)
        if url.scheme in ("", "file") and not local.exists():
            raise FileNotFoundError(errno.ENOENT, "no Parquet export", args.parquet)
    return AuditInput.of(
        dirs or None,
        args.parquet,
        clusters=tuple(clusters) if dirs else (),
        since_ms=window_time(since, "--since") if since else None,
        until_ms=window_time(until, "--until") if until else None,
    )


def window_time(text: str, flag: str = "--since", now_ms: int | None = None) -> int:
    """A --since/--until bound in epoch ms: a duration back from now (``10m``, ``2h``,
    ``7d``: as `metactl events --since`), an ISO 8601 time (UTC unless it says
    otherwise), or epoch milliseconds. INVALID_CONFIG naming `flag` otherwise."""
    from ops.times import parse_since

    now = int(time.time() * 1000) if now_ms is None else now_ms
    return parse_since(text, now, flag, epoch_ms=True)
