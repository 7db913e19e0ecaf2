"""`metactl quorum describe --status|--replication`: the controller quorum, as
`kafka-metadata-quorum.sh describe` shows KRaft's.

Every controller named by `--bootstrap-controller` is asked `DescribeQuorum` at once
(each answers for itself, active or standby, and is never redirected), and then, at
once, every controller the answers name that was not asked yet: the active one, and on
etcd every controller recorded there (`metadata_log.etcd.registry`: each controller
records itself when it starts and refreshes its last-seen time every few seconds), so
asking one controller lists them all, as kafka-metadata-quorum lists every voter. A
controller that does not answer within `ASK_S` (or `--timeout`, if shorter) is shown as
unreachable with its error and, if recorded, its node id and when it was last seen; only
when none answers does the command fail, with the first error (docs/cli.md's table:
NETWORK_EXCEPTION, status 5).

* `--status`: Kafka's fields where they mean the same here (ClusterId, LeaderId,
  LeaderEpoch: on etcd the leadership key's create revision, the term's fencing token;
  HighWatermark: the committed log end; MaxFollowerLag), and metactl's (the log, the
  leader's address and since when, every controller and its role). A single controller
  on a SQLite log has no election and so no term: it says so.
* `--replication`: one row per controller, in columns as wide as their contents: node,
  address, applied offset, lag (behind the active controller's log end; on Kafka,
  LogEndOffset and Lag), role (active, standby, unreachable); and on etcd each member's
  own status (Raft leader or follower, healthy or not and why, Raft index and term), read
  by the active controller (else the first that answered) from the members themselves.

`--json` prints one object instead. This module parses and prints: the asking is
`clients.quorum`'s, the answers are built by the controllers (`controller.runtime.quorum`)
and etcd's by `metadata_log.etcd.health.member_health`.

`metactl quorum remove --node ID --data-dir etcd://HOST:PORT/PREFIX [--force]
[--if-exists]` (Kafka's remove-controller) forgets a controller retired for good: its
record in etcd, so that `describe` stops listing it as unreachable. It talks to etcd
itself (no controller need be running) and only parses, calls
`metadata_log.etcd.retire.remove_controller` (the checks and the transaction) and prints
one line (or `--json`).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from metactl.errors import InvalidConfigurationError
from metactl.numbers import decimal_arg
from metadata_log.etcd.tls import add_etcd_tls_arguments
from ops.cli import EXIT_OK, HELP_FORMAT, examples
from ops.client import add_controller_arguments, controller_address, security_from

if TYPE_CHECKING:
    from clients.quorum import QuorumView, Summary
    from metadata_log.etcd.retire import Removed
    from protocol.messages.admin import EtcdMemberState

__all__ = ["register", "removal_line"]

SQLITE_TERM: Final = "none (one controller on a SQLite log: no election, so no term)"
# `clients.quorum.ASK_S`, copied for --help: the clients load the protocol client when the
# command runs, not to build its parser (issue 34; tests/ops/test_cli_imports.py checks
# that they agree).
ASK_S: Final = 5.0


def register(sub: Any) -> None:
    q = sub.add_parser(
        "quorum",
        help="the controller quorum, like kafka-metadata-quorum",
        description="The controller quorum: who is active, its term, how far each "
        "controller has applied the log, and the etcd members' health "
        "(kafka-metadata-quorum.sh describe).",
        epilog=examples(
            "metactl quorum describe --status",
            "metactl quorum describe --replication "
            "--bootstrap-controller 127.0.0.1:9093,127.0.0.1:9094,127.0.0.1:9095",
        ),
        formatter_class=HELP_FORMAT,
    )
    q.set_defaults(help_parser=q)
    qsub = q.add_subparsers(dest="quorum_command", metavar="SUBCOMMAND")
    d = qsub.add_parser(
        "describe",
        help="the active controller and its term (--status) or every controller's "
        "progress and the etcd members (--replication)",
        description="Ask every controller of --bootstrap-controller, then every other "
        "controller the answers name (the active one and, on etcd, every controller "
        "recorded there), what it knows of the quorum. --status: the cluster id, the active "
        "controller, its term (the etcd leadership key's create revision; none for a "
        "single controller on SQLite), the log end and the largest lag. --replication: "
        "one row per controller (applied offset, lag behind the log end, role: active, "
        "standby or unreachable) and, on etcd, each member's health. A controller that "
        f"does not answer within {ASK_S:g} s is listed as unreachable (with when it was "
        "last seen, if recorded in etcd); the command fails only if none answers.",
        epilog=examples(
            "metactl quorum describe --status",
            "metactl quorum describe --replication --bootstrap-controller "
            "127.0.0.1:9093,127.0.0.1:9094,127.0.0.1:9095 --json",
        ),
        formatter_class=HELP_FORMAT,
    )
    what = d.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--status", action="store_true", help="the active controller, its term, the log end"
    )
    what.add_argument(
        "--replication",
        action="store_true",
        help="each controller's applied offset, lag and role, and the etcd members' health",
    )
    add_controller_arguments(d)
    d.add_argument("--json", action="store_true", help="one JSON object instead of text")
    d.set_defaults(func=cmd_describe)

    r = qsub.add_parser(
        "remove",
        help="forget a controller retired for good: delete its record in etcd "
        "(kafka-metadata-quorum remove-controller)",
        description="Delete the record a controller keeps of itself in etcd "
        "(controllers/<node id> under the log's prefix), so that quorum describe stops "
        "listing it as unreachable. Refused (status 1) for a node not recorded "
        "(VOTER_NOT_FOUND), the active controller (CONTROLLER_IS_ACTIVE, even with "
        "--force) and a controller seen within the last 15 s (CONTROLLER_IN_USE, unless "
        "--force): a running controller records itself again within 5 s, so stop it "
        "first. The delete is one etcd transaction that removes the record only if it is "
        "still the one read. Talks to etcd directly: no controller need be running.",
        epilog=examples(
            "metactl quorum remove --node c3 --data-dir etcd://127.0.0.1:2379/metactl",
            "metactl quorum remove --node c3 --data-dir etcd://127.0.0.1:2379/metactl "
            "--etcd-cacert data/certs/etcd/ca.pem --etcd-cert data/certs/etcd/admin.pem "
            "--etcd-key data/certs/etcd/admin-key.pem --json",
        ),
        formatter_class=HELP_FORMAT,
    )
    r.add_argument(
        "--node",
        "--controller-id",
        dest="node",
        required=True,
        metavar="ID",
        help="the controller's node id, as quorum describe lists it (required)",
    )
    r.add_argument(
        "--data-dir",
        required=True,
        metavar="URL",
        help="the etcd log's URL, etcd://HOST:PORT[,HOST:PORT...]/PREFIX (required)",
    )
    add_etcd_tls_arguments(r)
    r.add_argument(
        "--force",
        action="store_true",
        help="remove the record of a controller seen within the last 15 s too (never the "
        "active one's): a running controller records itself again within 5 s",
    )
    r.add_argument(
        "--if-exists",
        action="store_true",
        help="a node that is not recorded is not an error: nothing to do (status 0)",
    )
    r.add_argument(
        "--timeout",
        type=decimal_arg,
        default=5.0,
        metavar="S",
        help="seconds etcd may take to answer each call (default 5)",
    )
    r.add_argument("--json", action="store_true", help="one JSON object instead of text")
    r.set_defaults(func=cmd_remove)


def _controller_json(s: Summary, qv: QuorumView) -> dict[str, Any]:
    out: dict[str, Any]
    if qv.view is None:
        assert qv.error is not None
        out = {}
        if qv.registered is not None:
            out["node_id"] = qv.registered.node_id
        out |= {
            "address": qv.asked,
            "role": "unreachable",
            "error": {"code": qv.error.code, "message": qv.error.message},
        }
    else:
        v = qv.view
        out = {
            "node_id": v.node_id,
            "address": v.address,
            "role": v.role,
            "applied_offset": v.applied_offset,
            "log_end_offset": v.log_end_offset,
            "lag": s.lag(v),
        }
    if qv.registered is not None:
        out["started_ms"] = qv.registered.started_ms
        out["last_seen_ms"] = qv.registered.last_seen_ms
    return out


def as_json(s: Summary, *, replication: bool) -> dict[str, Any]:
    src = s.source
    leader = None
    if src.leader_id is not None:
        leader = {
            "id": src.leader_id,
            "address": src.leader_address,
            "term": src.term,
            "since_ms": src.leader_since_ms,
            "lease_ttl_s": src.lease_ttl_s,
        }
    out: dict[str, Any] = {
        "cluster_id": src.cluster_id,
        "backend": src.backend,
        "metadata_log": src.log,
        "leader": leader,
        "high_watermark": s.high_watermark,
        "max_follower_lag": s.max_follower_lag,
        "controllers": [_controller_json(s, v) for v in s.views],
    }
    if src.leader_id is None:
        out["leader_problem"] = src.leader_problem
    if s.controllers_error is not None:
        out["controllers_error"] = s.controllers_error
    if replication:
        e = s.etcd
        from msgspec import to_builtins

        out["etcd_members"] = [to_builtins(m) for m in e.etcd_members] if e else []
        if e is not None and e.etcd_error:
            out["etcd_error"] = e.etcd_error
    return out


# --- text -----------------------------------------------------------------------------------


def _age(ms: int) -> str:
    """How long ago the epoch milliseconds `ms` were: `37s`, `4m05s`, `3h12m`."""
    seconds = max(0, int(time.time() - ms / 1000))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _ago(ms: int | None) -> str:
    if not ms:
        return "-"
    from eventfeed.feed import iso_ms

    return f"{iso_ms(ms)} ({_age(ms)} ago)"


def _last_seen(qv: QuorumView) -> str:
    r = qv.registered
    return f"last seen {_age(r.last_seen_ms)} ago" if r is not None and r.last_seen_ms else ""


def _who(qv: QuorumView) -> str:
    if qv.view is None:
        seen = _last_seen(qv)
        if qv.registered is not None:
            return f"{qv.registered.node_id}@{qv.asked} (unreachable{', ' if seen else ''}{seen})"
        return f"{qv.asked} (unreachable)"
    v = qv.view
    name = v.address if v.node_id == v.address else f"{v.node_id}@{v.address}"
    return f"{name} ({v.role})"


def status_lines(s: Summary) -> list[str]:
    src = s.source
    ids = sorted({v.view.cluster_id for v in s.views if v.view is not None and v.view.cluster_id})
    cluster = src.cluster_id or "-"
    if len(ids) > 1:
        cluster += f"  (the controllers disagree: {', '.join(ids)})"
    lines = [
        f"ClusterId:         {cluster}",
        f"MetadataLog:       {src.log} ({src.backend})",
    ]
    if src.leader_id is None:
        lines.append(f"LeaderId:          none (no controller is active: {src.leader_problem})")
    else:
        lines += [
            f"LeaderId:          {src.leader_id}",
            f"LeaderAddress:     {src.leader_address or '-'}",
        ]
        if src.backend == "etcd":
            ttl = f"; lease TTL {src.lease_ttl_s} s" if src.lease_ttl_s else ""
            lines.append(
                f"LeaderEpoch:       {src.term}  (the etcd leadership key's create revision, "
                f"the term's fencing token{ttl})"
            )
        else:
            lines.append(f"LeaderEpoch:       {SQLITE_TERM}")
        lines.append(f"LeaderSince:       {_ago(src.leader_since_ms)}")
    lines += [
        f"HighWatermark:     {s.high_watermark}  (the committed log end offset"
        + ("" if s.active is not None else ", the largest a standby knows: no active answered")
        + ")",
        f"MaxFollowerLag:    {s.max_follower_lag}",
        f"Controllers:       [{', '.join(_who(v) for v in s.views)}]",
    ]
    return lines


def _rows(s: Summary) -> list[tuple[str, str, str, str, str]]:
    """One (node, address, applied offset, lag, role) per controller."""
    rows = []
    for qv in s.views:
        if qv.view is None:
            assert qv.error is not None
            node = qv.registered.node_id if qv.registered is not None else "-"
            seen = _last_seen(qv)
            role = (
                f"unreachable ({seen}{'; ' if seen else ''}"
                f"{qv.error.code}: {' '.join(qv.error.message.split())})"
            )
            rows.append((node, qv.asked, "-", "-", role))
            continue
        v = qv.view
        rows.append((v.node_id, v.address, str(v.applied_offset), str(s.lag(v)), v.role))
    return rows


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]], right: set[int]) -> list[str]:
    """`header` and `rows` in columns as wide as their widest cell (the last column
    unpadded), the columns in `right` aligned right: a long node id or address never
    pushes the next column out of line."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]

    def line(cells: tuple[str, ...]) -> str:
        padded = [
            cells[i].rjust(w) if i in right else cells[i].ljust(w) for i, w in enumerate(widths)
        ]
        return "  ".join([*padded, cells[-1]])

    return [line(header)] + [line(r) for r in rows]


CONTROLLERS: Final = ("NODE", "ADDRESS", "APPLIED OFFSET", "LAG", "ROLE")
MEMBERS: Final = ("NAME", "CLIENT URL", "RAFT", "RAFT INDEX", "RAFT TERM", "HEALTH")


def replication_lines(s: Summary) -> list[str]:
    lines = _table(CONTROLLERS, _rows(s), right={2, 3})
    if s.controllers_error is not None:
        lines.append(f"(the controllers recorded in etcd could not be read: {s.controllers_error})")
    e = s.etcd
    if s.source.backend == "etcd":
        lines.append("")
        if e is None:
            lines.append("etcd members: no controller could say")
        else:
            via = e.node_id if e.node_id == e.address else f"{e.node_id}@{e.address}"
            lines.append(f"etcd members (asked by {via}):")
            if e.etcd_error:
                lines.append(f"  their status could not be read: {e.etcd_error}")
            if e.etcd_members:
                members = [_member_cells(m) for m in e.etcd_members]
                lines += _table(MEMBERS, members, right={3, 4})
    return lines


def _member_cells(m: EtcdMemberState) -> tuple[str, str, str, str, str, str]:
    raft = m.raft_role or "-"
    index = "-" if m.raft_index is None else str(m.raft_index)
    term = "-" if m.raft_term is None else str(m.raft_term)
    health = "healthy" if m.healthy else f"unhealthy: {m.error or 'unknown'}"
    return (m.name, m.client_url, raft, index, term, health)


# --- the command ----------------------------------------------------------------------------


def cmd_describe(args: argparse.Namespace) -> int:
    import asyncio

    from clients.quorum import Summary, gather

    addresses = controller_address(args).split(",")
    security = security_from(args)
    views = asyncio.run(
        gather(addresses, security, args.timeout, etcd_members=bool(args.replication))
    )
    if all(v.view is None for v in views):
        first = views[0].error
        assert first is not None
        raise first
    summary = Summary.of(views)
    if args.json:
        print(json.dumps(as_json(summary, replication=bool(args.replication))))
        return EXIT_OK
    lines = replication_lines(summary) if args.replication else status_lines(summary)
    print("\n".join(lines))
    return EXIT_OK


def cmd_remove(args: argparse.Namespace) -> int:
    import asyncio

    from metadata_log.backends import is_etcd_url

    url: str = args.data_dir
    node: str = args.node
    if not is_etcd_url(url):
        raise InvalidConfigurationError(
            f"--data-dir {url!r} is not an etcd log's URL (etcd://HOST:PORT/PREFIX): only "
            "controllers on etcd record themselves; a single controller on SQLite has no "
            "record to remove"
        )
    if not node or not node.isprintable() or node != node.strip():
        raise InvalidConfigurationError(f"--node must be a controller's node id: got {node!r}")
    if not args.timeout > 0:
        raise InvalidConfigurationError(f"--timeout must be positive, got {args.timeout}")

    from metadata_log.etcd.client import Etcd  # loads gRPC: only here
    from metadata_log.etcd.retire import remove_controller
    from metadata_log.etcd.target import EtcdTarget

    async def run() -> tuple[str, Removed | None]:
        etcd = await Etcd.connect(EtcdTarget.parse(url), timeout_s=args.timeout)
        try:
            removed = await remove_controller(
                etcd, node, force=bool(args.force), if_exists=bool(args.if_exists)
            )
            return etcd.target.url, removed
        finally:
            await etcd.close()

    where, removed = asyncio.run(run())
    if args.json:
        out: dict[str, Any] = {"node_id": node, "metadata_log": where, "removed": False}
        if removed is not None:
            out["removed"] = True
            if removed.entry is not None:
                out["address"] = removed.entry.address
                out["started_ms"] = removed.entry.started_ms
                out["last_seen_ms"] = removed.entry.last_seen_ms
            out["revision"] = removed.revision
            out["forced"] = removed.forced
        print(json.dumps(out))
    else:
        print(removal_line(node, where, removed))
    return EXIT_OK


def removal_line(node: str, where: str, removed: Removed | None) -> str:
    """The one line `quorum remove` prints (`removed` None: `--if-exists` found nothing)."""
    from metadata_log.etcd.registry import REFRESH_S  # loaded by the removal already

    if removed is None:
        return f"controller {node} is not recorded under {where}: nothing to remove"
    entry = removed.entry
    if entry is None:
        what = "an unreadable record"
    else:
        seen = f", last seen {_age(entry.last_seen_ms)} ago" if entry.last_seen_ms else ""
        what = f"{entry.address}{seen}"
    line = f"removed controller {node} ({what}) from {where}: quorum describe no longer lists it"
    if removed.forced:
        line += (
            f"; it was seen {max(0.0, removed.seen_ago_s or 0.0):.0f} s before (--force): if it "
            f"is still running it records itself again within {REFRESH_S:g} s"
        )
    return line
