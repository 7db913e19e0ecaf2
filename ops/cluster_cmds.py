"""`cluster up` (topics create and elect are in ops/admin_cmds.py; describe and brokers,
which page through the answer, in ops/describe_cmds.py).

Changes always go through the controller. Online commands use mutual TLS unless
`--insecure` (`ops.client.security_from`): as `admin` by default, `--principal viewer`
to read only.

`cluster up` makes the cluster's certificates in DATA_DIR/certs (`ops.certs.init_certs`,
kept across runs) and runs the controller and brokers with mutual TLS; `--insecure`
runs everything in plaintext. It prints how to point the CLI at the cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from metactl.errors import MetactlError
from ops.certs import default_names, init_certs
from ops.client import DEFAULT_CONTROLLER, INSECURE, Security, call
from protocol.flags import ENV_TLS_DIR
from protocol.messages import (
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
)
from protocol.tls import ADMIN, CA_CERT, VIEWER, TlsIdentity, cert_path, key_path


def register(sub: Any) -> None:
    up = sub.add_parser("cluster", help="local clusters")
    usub = up.add_subparsers(dest="cluster_command", metavar="SUBCOMMAND")
    u = usub.add_parser("up", help="start a controller and N brokers until Ctrl-C")
    u.add_argument("--brokers", type=int, default=3)
    u.add_argument("--data-dir", type=Path, default=Path("./data"))
    u.add_argument("--listen", default=DEFAULT_CONTROLLER)
    u.add_argument("--metrics", default="127.0.0.1:9400")
    u.add_argument("--topic", default="demo")
    u.add_argument("--partitions", type=int, default=6)
    u.add_argument("--min-isr", type=int, default=2)
    u.add_argument("--unclean-recovery-strategy", default="balanced")
    u.add_argument(
        "--insecure",
        action="store_true",
        help="run everything without TLS (default: mutual TLS, certificates made in "
        "DATA_DIR/certs)",
    )
    u.add_argument("--exit-after-ready", action="store_true", help=argparse.SUPPRESS)
    u.set_defaults(func=cmd_cluster_up)


def _fail(exc: BaseException) -> int:
    print(f"error: {exc}", file=sys.stderr)
    return 1


# --- cluster up -------------------------------------------------------------------------


def _start(cmd: list[str], log_path: Path) -> tuple[subprocess.Popen[str], IO[str]]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = log_path.open("a")
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=log_file, text=True, start_new_session=True
    )
    return proc, log_file


def _await_ready(proc: subprocess.Popen[str], what: str, timeout_s: float = 60) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{what} exited before it was ready (status {proc.wait()})")
        if line.startswith("READY"):
            return line.strip()
    raise RuntimeError(f"{what} was not ready within {timeout_s:.0f} s")


def cmd_cluster_up(args: argparse.Namespace) -> int:
    data: Path = args.data_dir.resolve()
    py = sys.executable
    procs: list[tuple[str, subprocess.Popen[str], IO[str]]] = []
    try:
        certs = data / "certs"
        if args.insecure:
            flags, security = ["--insecure"], INSECURE
        else:
            created = init_certs(certs, default_names(range(1, args.brokers + 1)))
            if created:
                print(f"certificates: created {', '.join(created)} in {certs}", flush=True)
            flags, security = (
                ["--tls-dir", str(certs)],
                Security(TlsIdentity.from_dir(certs, ADMIN)),
            )
        ctl, f = _start(
            [py, "-m", "controller", "--data-dir", str(data / "controller"),
             "--listen", args.listen, "--metrics", args.metrics,
             "--unclean-recovery-strategy", args.unclean_recovery_strategy, *flags],
            data / "logs" / "controller.log",
        )  # fmt: skip
        procs.append(("controller", ctl, f))
        ready = _await_ready(ctl, "controller")
        address = ready.split("listen=")[1].split()[0]
        metrics = ready.split("metrics=")[1].split()[0] if "metrics=" in ready else args.metrics
        for i in range(1, args.brokers + 1):
            b, f = _start(
                [py, "-m", "brokers_stub", "--id", str(i), "--controller", address,
                 "--data-dir", str(data / f"broker-{i}"), *flags],
                data / "logs" / f"broker-{i}.log",
            )  # fmt: skip
            procs.append((f"broker {i}", b, f))
        for name, p, _ in procs[1:]:
            _await_ready(p, name)
        asyncio.run(_await_active(address, args.brokers, security=security))
        spec = CreateTopic(
            name=args.topic,
            partitions=args.partitions,
            replication_factor=min(3, args.brokers),
            min_isr=args.min_isr,
        )
        r = asyncio.run(call(address, CreateTopicsRequest(topics=[spec]), security=security))
        assert isinstance(r, CreateTopicsResponse)
        res = r.results[0]
        created_topic = "created" if not res.error_code else f"kept ({res.error_code})"
        stop = {"now": False}

        def _stop(signum: int, frame: object) -> None:
            stop["now"] = True

        # Before the banner: whoever reads "Ctrl-C stops" may press it at once.
        signal.signal(signal.SIGINT, _stop)
        signal.signal(signal.SIGTERM, _stop)
        pids = ", ".join(f"{n}={p.pid}" for n, p, _ in procs)
        print(
            f"metactl cluster up: controller {address}, {args.brokers} brokers, "
            f"topic {args.topic} {created_topic}\n"
            + _how_to(data, address, metrics, None if args.insecure else certs)
            + f"  pids:     {pids}\nCtrl-C stops everything cleanly.",
            flush=True,
        )
        if args.exit_after_ready:
            return 0
        while not stop["now"]:
            signal.pause()
        return 0
    except (MetactlError, OSError, RuntimeError) as exc:
        return _fail(exc)
    finally:
        _shutdown(procs)


def _how_to(data: Path, address: str, metrics: str, certs: Path | None) -> str:
    """What `cluster up` prints after its first line: where things are, what to run."""
    me = "metactl"
    if certs is None:
        sec = "--insecure"
        lines = [
            f"  data:     {data}  (logs in {data / 'logs'})",
            "  security: none (--insecure): anyone may act as any broker or as an admin",
            f"  metrics:  http://{metrics}/metrics",
        ]
    else:
        sec = f"--tls-dir {certs}"
        ca, cert, key = certs / CA_CERT, cert_path(certs, VIEWER), key_path(certs, VIEWER)
        lines = [
            f"  data:     {data}  (logs in {data / 'logs'})",
            f"  security: mutual TLS; certificates in {certs} (the CLI acts as admin;",
            "            --principal viewer reads only). Instead of --tls-dir on every",
            f"            command: export {ENV_TLS_DIR}={certs}",
            f"  metrics:  https://{metrics}/metrics  (a client certificate of the CA)",
            f"            curl --cacert {ca} --cert {cert} --key {key} https://{metrics}/metrics",
        ]
    lines += [
        f"  try:      {me} describe --controller {address} {sec}",
        f"            {me} brokers --controller {address} {sec} --principal viewer"
        if certs is not None
        else f"            {me} brokers --controller {address} {sec}",
        f"            {me} log tail --data-dir {data / 'controller'}",
        "            kill -9 <a broker pid> and watch describe: fence, ELR, recovery",
    ]
    return "\n".join(lines) + "\n"


async def _await_active(
    address: str, brokers: int, timeout_s: float = 60, *, security: Security = INSECURE
) -> None:
    """Brokers unfence once they have caught up with the log; wait for all of them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = await call(address, DescribeClusterRequest(), security=security)
        assert isinstance(r, DescribeClusterResponse)
        if sum(1 for b in r.brokers if not b.fenced and not b.controlled_shutdown) >= brokers:
            return
        await asyncio.sleep(0.1)  # polling an observable state
    raise RuntimeError(f"brokers did not all become active within {timeout_s:.0f} s")


def _shutdown(procs: list[tuple[str, subprocess.Popen[str], IO[str]]]) -> None:
    """Brokers first (controlled shutdown needs the controller), then the controller."""
    brokers = [p for p in procs if p[0] != "controller"]
    controller = [p for p in procs if p[0] == "controller"]
    for group in (brokers, controller):
        for _, p, _ in group:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
        for name, p, f in group:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                print(f"{name} did not stop within 30 s; killing it", file=sys.stderr)
                p.kill()
                p.wait()
            f.close()
