"""Coverage-guided fuzzing of the wire (issue 11): the frame codec, and every request type
through the real controller dispatcher, with atheris (libFuzzer over Python bytecode).

Two targets, each in its own child process (atheris.Fuzz never returns):

- `codec`: each input is a frame payload (its first 4 bytes also go through
  `frame_length`). Only a coded MetactlError may come out of `decode_frame`, with a
  decode code, and a decoded frame must re-encode to itself.
- `dispatcher`: each input is a frame payload, sent with its true length over one TCP
  connection to a real `ControllerService` (SQLite log, seeded with 3 brokers and a
  topic; virtual time that never moves). Every answer must be the request's response or a
  coded ErrorResponse (UNKNOWN_SERVER_ERROR counts as a crash) under its correlation id,
  and a rejected request must leave the log end offset unchanged. The target restarts
  from a fresh log every `--reset-every` inputs.

Both use libFuzzer's coverage of the project's Python code (protocol, controller,
metadata_image, metadata_log, metactl; msgspec is C and uninstrumented) and a
structure-aware mutator (bench/wire_cases.py) next to libFuzzer's byte mutations.

Reported per target: inputs run, crashes (any non-MetactlError exception), hangs (no
answer within `--deadline-s`; a blocking loop is interrupted by SIGALRM a second later),
other contract violations, tracebacks seen in the logs (structlog's JSON output as the
services write it, stdlib logging, unraisable and thread exceptions), state changes from
rejected requests, peak RSS (VmHWM), and libFuzzer's coverage counters.

`--plant` runs with a deliberate bug, to show that each checker catches one.

Run: python bench/fuzz_wire.py [--inputs 1000000] [--target both|codec|dispatcher]
     [--dispatcher-inputs N] [--deadline-s 2] [--seed 1] [--plant KIND] [--json]
Prints figures; exit status 1 if anything was found.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import importlib
import itertools
import json
import logging
import os
import pkgutil
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

INSTRUMENTED = ["protocol", "controller", "metadata_image", "metadata_log", "metactl"]
PLANTS = ["codec-narrow", "dispatch-crash", "state-change", "blocking-hang"]


class Deadline(BaseException):
    """Raised by SIGALRM in whatever the main thread was running past the deadline."""


def _on_alarm(signum: int, frame: Any) -> None:
    signal.setitimer(signal.ITIMER_REAL, 0)
    raise Deadline


class LogSink:
    """Where structlog writes (JSON lines, as services do): counts lines and tracebacks."""

    def __init__(self) -> None:
        self.lines = 0
        self.tracebacks = 0
        self.examples: list[str] = []

    def write(self, text: str) -> int:
        for line in text.splitlines():
            self.lines += 1
            if '"exception"' in line or "Traceback (most recent call last)" in line:
                self.seen(line)
        return len(text)

    def flush(self) -> None:
        pass

    def seen(self, text: str) -> None:
        self.tracebacks += 1
        if len(self.examples) < 3:
            self.examples.append(text[:2000])


class _StdlibCounter(logging.Handler):
    def __init__(self, sink: LogSink) -> None:
        super().__init__(logging.WARNING)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[0] is Deadline:
            return  # our own interrupt of a blocked loop, reported as a hang
        if record.exc_info or record.levelno >= logging.ERROR:
            self.sink.seen(f"stdlib {record.name}: {record.getMessage()}")


def _capture_logs(sink: LogSink) -> None:
    from metactl.logs import configure

    configure(json=True, level=logging.INFO, stream=sink)  # type: ignore[arg-type]
    logging.getLogger().addHandler(_StdlibCounter(sink))
    sys.unraisablehook = lambda u: sink.seen(f"unraisable: {u.exc_type.__name__}")
    threading.excepthook = lambda a: sink.seen(f"thread: {a.exc_type.__name__}")


class Child:
    """One fuzzing process: a target, its counters, and the libFuzzer callbacks."""

    def __init__(self, args: argparse.Namespace, sink: LogSink) -> None:
        import wire_cases  # bench/, this script's directory

        self.wc = wire_cases
        self.args = args
        self.sink = sink
        self.seeds = wire_cases.seed_payloads()
        self.inputs = 0
        self.crashes = 0
        self.hangs = 0
        self.state_changes = 0
        self.restarts = 0
        self.violations: collections.Counter[str] = collections.Counter()
        self.requests: collections.Counter[str] = collections.Counter()
        self.answers: collections.Counter[str] = collections.Counter()
        self.findings: list[dict[str, str]] = []
        self.started = time.perf_counter()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.target: Any = None
        self.data_dir: Path | None = None
        if args.child == "dispatcher":
            self._start_target(new_loop=True)

    # --- the dispatcher target ------------------------------------------------------------

    def _start_target(self, *, new_loop: bool) -> None:
        if new_loop or self.loop is None:
            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
        shm = Path("/dev/shm")
        base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
        self.data_dir = Path(tempfile.mkdtemp(prefix="fuzz-wire-", dir=base))
        self.target = self.wc.WireTarget(self.data_dir)
        self.loop.run_until_complete(self.target.start())

    def _restart(self, *, new_loop: bool) -> None:
        self.restarts += 1
        assert self.loop is not None
        try:
            self.loop.run_until_complete(asyncio.wait_for(self.target.stop(), 10))
        except BaseException:  # a target broken by a hang may not stop cleanly
            new_loop = True
            store = self.target.service.store if self.target.service else None
            if store is not None:
                with contextlib.suppress(BaseException):
                    self.loop.run_until_complete(asyncio.wait_for(store.close(), 5))
        if new_loop:
            with contextlib.suppress(BaseException):
                self.loop.close()
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        self._start_target(new_loop=new_loop)

    def _dispatch_one(self, data: bytes) -> None:
        assert self.loop is not None
        deadline = self.args.deadline_s
        try:
            signal.setitimer(signal.ITIMER_REAL, deadline + 1.0)
            try:
                outcome = self.loop.run_until_complete(self.target.exchange(data, deadline))
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except self.wc.WireViolation as v:
            self._violation(v.kind, str(v), data)
            if v.kind == "closed":
                self._restart(new_loop=False)
            return
        except self.wc.Hang as h:
            self.hangs += 1
            self._finding("hang", str(h), data)
            self._restart(new_loop=False)
            return
        except Deadline:
            self.hangs += 1
            self._finding("hang", f"blocked the event loop past {deadline + 1} s", data)
            self._restart(new_loop=True)
            return
        except Exception as exc:  # the harness itself failed, e.g. on an unreadable answer
            self.crashes += 1
            self._finding("crash", _summary(exc), data)
            self._restart(new_loop=False)
            return
        self.requests[outcome.request] += 1
        self.answers[f"{outcome.request} -> {outcome.answer}"] += 1
        if self.inputs % self.args.reset_every == 0 or self.target.log_end[0] > 20_000:
            self._restart(new_loop=False)

    # --- the codec target -------------------------------------------------------------------

    def _codec_one(self, data: bytes) -> None:
        from metactl.errors import FrameTooLargeError
        from protocol.codec import frame_length

        try:
            signal.setitimer(signal.ITIMER_REAL, self.args.deadline_s)
            try:
                with contextlib.suppress(FrameTooLargeError):
                    frame_length(data[:4].ljust(4, b"\0"), 64 * 1024)
                label = self.wc.check_codec(data)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except self.wc.WireViolation as v:
            self._violation(v.kind, str(v), data)
            return
        except Deadline:
            self.hangs += 1
            self._finding("hang", f"decode took over {self.args.deadline_s} s", data)
            return
        except Exception as exc:
            self.crashes += 1
            self._finding("crash", _summary(exc), data)
            return
        self.requests[label] += 1

    # --- libFuzzer callbacks ------------------------------------------------------------------

    def test_one_input(self, data: bytes) -> None:
        self.inputs += 1
        if self.args.child == "codec":
            self._codec_one(data)
        else:
            self._dispatch_one(data)
        if self.inputs % 100_000 == 0:
            rate = self.inputs / (time.perf_counter() - self.started)
            print(f"#fuzz_wire {self.inputs} inputs, {rate:,.0f}/s", file=sys.stderr, flush=True)
        if self.inputs >= self.args.inputs:
            self.finish()

    def mutator(self, data: bytes, max_size: int, seed: int) -> bytes:
        import atheris  # type: ignore[import-untyped]

        rnd = random.Random(seed)
        if rnd.random() < 0.3:
            out: bytes = atheris.Mutate(data, max_size)
            return out
        return self.wc.mutate(data, rnd, self.seeds, max_size)

    # --- findings and the report --------------------------------------------------------------

    def _violation(self, kind: str, detail: str, data: bytes) -> None:
        self.violations[kind] += 1
        if kind == "unknown_server_error":
            self.crashes += 1
        elif kind == "state_change":
            self.state_changes += 1
        self._finding(kind, detail, data)

    def _finding(self, kind: str, detail: str, data: bytes) -> None:
        if sum(f["kind"] == kind for f in self.findings) < 3:
            self.findings.append({"kind": kind, "detail": detail[:1500], "input": data.hex()})

    def finish(self) -> None:
        elapsed = time.perf_counter() - self.started
        if self.target is not None and self.loop is not None:
            with contextlib.suppress(BaseException):
                self.loop.run_until_complete(asyncio.wait_for(self.target.stop(), 10))
            if self.data_dir is not None:
                shutil.rmtree(self.data_dir, ignore_errors=True)
        report = {
            "target": self.args.child,
            "plant": self.args.plant,
            "inputs": self.inputs,
            "elapsed_s": round(elapsed, 1),
            "inputs_per_s": round(self.inputs / elapsed),
            "crashes": self.crashes,
            "hangs": self.hangs,
            "violations": dict(self.violations),
            "state_changes_from_rejected": self.state_changes,
            "tracebacks_in_logs": self.sink.tracebacks,
            "log_lines": self.sink.lines,
            "peak_rss_mib": _vm_hwm_mib(),
            "restarts": self.restarts,
            "requests": dict(self.requests.most_common()),
            "answers": dict(self.answers.most_common(60)),
            "findings": self.findings,
            "traceback_examples": self.sink.examples,
        }
        Path(self.args.report).write_text(json.dumps(report, indent=1))
        sys.stderr.flush()
        os._exit(0)


def _summary(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)[-3:]
    where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb))
    return f"{type(exc).__name__}: {exc} at {where}"


def _vm_hwm_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return -1.0


def _plant(kind: str | None) -> None:
    """A deliberate bug in this process only, to show the checkers catch it."""
    if kind is None:
        return
    import msgspec

    from controller.runtime.frame_listener import FrameListener
    from metactl.errors import MetactlError
    from protocol import codec
    from protocol.messages.admin import DescribeClusterRequest, ElectLeader
    from protocol.messages.broker_controller import RegisterBroker

    if kind == "codec-narrow":  # UnicodeDecodeError and RecursionError escape
        codec._UNDECODABLE = (msgspec.DecodeError,)  # type: ignore[misc,assignment]
        return
    original = FrameListener.dispatch
    fresh_ids = itertools.count(1000)

    async def planted(self: FrameListener, body: Any, peer: Any) -> Any:
        if kind == "dispatch-crash" and isinstance(body, ElectLeader) and body.partition > 2:
            raise KeyError(body.partition)
        if kind == "blocking-hang" and isinstance(body, DescribeClusterRequest):  # noqa: SIM102
            if body.topic == "tt":  # mutated from the seed's "t"
                while True:
                    pass
        try:
            return await original(self, body, peer)
        except MetactlError:
            if kind == "state-change" and isinstance(body, ElectLeader):
                new = RegisterBroker(broker_id=next(fresh_ids), incarnation_id="planted")
                await self.apis.role.controller.submit(new)
            raise

    FrameListener.dispatch = planted  # type: ignore[method-assign]


def run_child(args: argparse.Namespace) -> None:
    import atheris

    with atheris.instrument_imports(include=INSTRUMENTED):
        for name in INSTRUMENTED:  # every module, so lazily imported ones are covered too
            package = importlib.import_module(name)
            for mod in pkgutil.walk_packages(package.__path__, f"{name}."):
                if not mod.name.endswith("__main__"):
                    importlib.import_module(mod.name)
    sink = LogSink()
    _capture_logs(sink)
    _plant(args.plant)
    signal.signal(signal.SIGALRM, _on_alarm)
    child = Child(args, sink)
    corpus = Path(args.report).with_suffix(".corpus")
    corpus.mkdir(exist_ok=True)
    for i, seed in enumerate(child.seeds):
        (corpus / f"seed-{i}").write_bytes(seed)
    flags = [
        f"-seed={args.seed}",
        f"-max_len={args.max_len}",
        "-len_control=0",
        "-timeout=0",  # the deadline is ours (SIGALRM); libFuzzer's would abort the run
        "-rss_limit_mb=4096",
        "-print_final_stats=0",
    ]
    atheris.Setup([sys.argv[0], *flags, str(corpus)], child.test_one_input,
                  custom_mutator=child.mutator)  # fmt: skip
    atheris.Fuzz()


# --- the parent: one child per target, then the table ------------------------------------------


def run_target(target: str, inputs: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    report, log = workdir / f"{target}.json", workdir / f"{target}.stderr"
    cmd = [sys.executable, __file__, "--child", target, "--report", str(report)]
    for flag in ("inputs", "seed", "max_len", "deadline_s", "reset_every"):
        value = inputs if flag == "inputs" else getattr(args, flag)
        cmd += [f"--{flag.replace('_', '-')}", str(value)]
    cmd += ["--plant", args.plant] if args.plant else []
    print(f"fuzzing {target}: {inputs:,} inputs (libFuzzer output: {log})", file=sys.stderr)
    started = time.perf_counter()
    with log.open("w") as err:
        rc = subprocess.run(cmd, stdout=err, stderr=subprocess.STDOUT, check=False).returncode
    text = log.read_text(errors="replace")
    if report.exists():
        result: dict[str, Any] = json.loads(report.read_text())
    else:  # libFuzzer ended the child: out of memory, a deadly signal, ...
        tail = "\n".join(text.splitlines()[-15:])
        result = {
            "target": target,
            "plant": args.plant,
            "inputs": None,
            "crashes": 1,
            "elapsed_s": round(time.perf_counter() - started, 1),
            "findings": [{"kind": "child died", "detail": f"exit {rc}:\n{tail}"}],
        }
    cov = re.findall(r"cov: (\d+) ft: (\d+) corp: (\d+)", text)
    if cov:
        result["libfuzzer"] = dict(zip(("cov", "ft", "corpus"), map(int, cov[-1]), strict=True))
    return result


def _print(results: list[dict[str, Any]]) -> None:
    keys = ["inputs", "inputs_per_s", "elapsed_s", "crashes", "hangs",
            "state_changes_from_rejected", "tracebacks_in_logs", "peak_rss_mib",
            "restarts"]  # fmt: skip
    print(f"{'':30}" + "".join(f"{r['target']:>16}" for r in results))
    for k in keys:
        print(f"{k:30}" + "".join(f"{_fmt(r.get(k)):>16}" for r in results))
    for r in results:
        if r.get("violations"):
            print(f"{r['target']} violations: {r['violations']}")
        if "libfuzzer" in r:
            print(f"{r['target']} libFuzzer coverage: {r['libfuzzer']}")
        if r.get("requests"):
            print(f"{r['target']} requests: {r['requests']}")
        for f in r.get("findings", []):
            print(f"  {r['target']} {f['kind']}: {f['detail']}")
            if f.get("input"):
                print(f"    input: {f['input'][:240]}")
        for t in r.get("traceback_examples", []):
            print(f"  {r['target']} traceback in logs: {t[:600]}")


def _fmt(v: Any) -> str:
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    p.add_argument("--inputs", type=int, default=1_000_000)
    p.add_argument("--dispatcher-inputs", type=int, default=None,
                   help="inputs for the dispatcher target (default: --inputs)")  # fmt: skip
    p.add_argument("--target", choices=["both", "codec", "dispatcher"], default="both")
    p.add_argument("--deadline-s", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-len", type=int, default=4096)
    p.add_argument("--reset-every", type=int, default=20_000)
    p.add_argument("--plant", choices=PLANTS, default=None)
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", choices=["codec", "dispatcher"], help=argparse.SUPPRESS)
    p.add_argument("--report", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        run_child(args)
        return
    targets = ["codec", "dispatcher"] if args.target == "both" else [args.target]
    workdir = Path(tempfile.mkdtemp(prefix="fuzz-wire-"))  # kept: reports, corpora, output
    counts = {"codec": args.inputs, "dispatcher": args.dispatcher_inputs or args.inputs}
    results = [run_target(t, counts[t], args, workdir) for t in targets]
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        _print(results)
    found = any(
        r.get("crashes") or r.get("hangs") or r.get("violations") or r.get("tracebacks_in_logs")
        for r in results
    )
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
