"""``audit all`` on a standalone Spark cluster: a 100M-record history, and a 10M slice.

Run ``python bench/spark_cluster.py [--records 100M] [--slice 10M] [--workers 2]``:

1. logs: tiled from the simulated base history of `bench/spark_audit.py` (reused there
   and here under ``--dir``), one of ``--records`` and one of ``--slice`` records;
2. each is exported to Parquet (``metactl log export``'s function; timed);
3. a standalone cluster is started on this machine (`audit.standalone`: a master and
   ``--workers`` workers of ``--cores`` cores, real processes);
4. ``metactl audit all --parquet ... --master spark://...`` runs as a command on the
   slice and on the full history, with the peak resident memory of the driver (the
   command and its JVM) and of each worker (its JVM, the executor JVM it starts and the
   executor's Python workers) sampled from /proc every 0.2 s;
5. the same command on the slice with ``--master local[2]``: every table and summary
   must equal the cluster's (a mismatch fails the run).

It prints the times, the peak memory, the growth from the slice to the full history,
and the full history's summaries. The driver's and workers' sizes are options
(``--driver-memory``, ``--executor-memory``, ``--worker-memory``). This script
measures; it must not be imported by the product.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from audit.export import export_parquet
from audit.export_layout import read_manifest
from audit.standalone import Standalone

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spark_audit import parse_size, sized_log

ROOT = Path(__file__).resolve().parents[1]
JOBS = ("elections", "unclean-recoveries", "offline", "brokers", "invariants")
PAGE = os.sysconf("SC_PAGE_SIZE")


# --- memory ----------------------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kids.setdefault(int(fields[1]), []).append(int(entry))
    return kids


def _tree(pid: int, kids: dict[int, list[int]]) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except OSError:
        return 0


@dataclass
class Peaks:
    """Peak resident memory (bytes) of process trees, sampled until stopped."""

    roots: dict[str, int]
    peak: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self._stop.is_set():
            kids = _children()
            for name, pid in self.roots.items():
                total = sum(_rss(p) for p in _tree(pid, kids))
                self.peak[name] = max(self.peak.get(name, 0), total)
            self._stop.wait(0.2)

    def __enter__(self) -> Peaks:
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# --- runs ------------------------------------------------------------------------------------


@dataclass
class AuditRun:
    label: str
    master: str
    records: int
    seconds: float
    status: int
    peaks: dict[str, int]
    out: Path
    stdout: str


def audit_all(
    pq: Path,
    out: Path,
    master: str,
    label: str,
    records: int,
    *,
    extra: list[str],
    watch: dict[str, int],
) -> AuditRun:
    cmd = [sys.executable, "-m", "ops.cli", "audit", "all", "--parquet", str(pq)]
    cmd += ["--master", master, "--out", str(out), "--progress", "off", *extra]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    with Peaks({"driver": proc.pid, **watch}) as peaks:
        stdout, stderr = proc.communicate()
    seconds = time.perf_counter() - started
    # Exit 1 is also a violation found; a failure says so on stderr (and writes nothing).
    if proc.returncode not in (0, 1) or stderr.strip() or not (out / JOBS[-1]).is_dir():
        raise SystemExit(f"audit all failed ({proc.returncode}): {stderr[-3000:]}")
    print(f"  {label} on {master}: {seconds:.1f} s", file=sys.stderr, flush=True)
    return AuditRun(label, master, records, seconds, proc.returncode, peaks.peak, out, stdout)


def _tables(out: Path, job: str) -> dict[str, pd.DataFrame]:
    return {p.stem: pd.read_parquet(p) for p in sorted((out / job).glob("*.parquet"))}


def _canonical(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    for col in out.columns:
        if out[col].dtype == object:
            out[col] = out[col].map(lambda v: v.tolist() if hasattr(v, "tolist") else v)
    keys = [c for c in out.columns if out[c].dtype != object or out[c].map(type).eq(str).all()]
    return out.sort_values(keys, kind="stable").reset_index(drop=True) if keys else out


def same_answers(a: Path, b: Path) -> None:
    """Every job's summary and tables equal (rows in a canonical order)."""
    for job in JOBS:
        if (a / job / "summary.txt").read_text() != (b / job / "summary.txt").read_text():
            raise SystemExit(f"{job}: the summaries of {a} and {b} differ")
        ta, tb = _tables(a, job), _tables(b, job)
        if ta.keys() != tb.keys():
            raise SystemExit(f"{job}: different tables in {a} and {b}")
        for name in ta:
            pd.testing.assert_frame_equal(
                _canonical(ta[name]), _canonical(tb[name]), obj=f"{job}/{name}"
            )


def _exported(log: Path, root: Path, size: int, reuse: bool) -> tuple[Path, float | None]:
    out = root / f"pq-{size}"
    manifest = read_manifest(str(out)) if reuse else None
    if manifest is not None:
        return out, None
    report = export_parquet([str(log)], out, overwrite=True)
    print("  " + "; ".join(report.lines()), file=sys.stderr, flush=True)
    return out, report.seconds


def _gb(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", default="100M", help="the full history (default 100M)")
    parser.add_argument("--slice", default="10M", help="the slice compared with local[2]")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores per worker")
    parser.add_argument("--worker-memory", default="6g")
    parser.add_argument("--executor-memory", default="3g")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--dir", type=Path, default=Path("bench/out/spark-audit"))
    parser.add_argument(
        "--reuse-exports", action="store_true", help="keep exports written by an earlier run"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per run")
    args = parser.parse_args(argv)
    full, part = parse_size(args.records), parse_size(args.slice)
    args.dir.mkdir(parents=True, exist_ok=True)
    logs = {size: sized_log(args.dir, size) for size in (part, full)}
    exports = {
        size: _exported(logs[size], args.dir, size, args.reuse_exports) for size in (part, full)
    }
    counts = {}
    for size, (pq, _) in exports.items():
        manifest = read_manifest(str(pq))
        assert manifest is not None
        counts[size] = sum(int(c["records"]) for c in manifest.clusters.values())
    runs: list[AuditRun] = []
    work = args.dir / "cluster-run"
    cluster = Standalone((work / "spark").resolve())
    extra = [
        *("--driver-memory", args.driver_memory),
        *("--conf", f"spark.executor.memory={args.executor_memory}"),
    ]
    try:
        cluster.start(args.workers, cores=args.cores, memory=args.worker_memory)
        watch = {f"worker-{i}": p.pid for i, p in enumerate(cluster.workers)}
        for size, label in ((part, "slice"), (full, "full")):
            runs.append(
                audit_all(
                    exports[size][0],
                    work / f"cluster-{size}",
                    cluster.url,
                    label,
                    counts[size],
                    extra=extra,
                    watch=watch,
                )
            )
    finally:
        cluster.stop()
    runs.append(
        audit_all(
            exports[part][0],
            work / f"local-{part}",
            "local[2]",
            "slice",
            counts[part],
            extra=["--driver-memory", args.driver_memory],
            watch={},
        )
    )
    same_answers(work / f"cluster-{part}", work / f"local-{part}")
    slice_run, full_run, local_run = runs
    if args.json:
        for r in runs:
            print(
                json.dumps(
                    {
                        "run": r.label,
                        "master": "local[2]" if r.master.startswith("local") else "standalone",
                        "records": r.records,
                        "seconds": round(r.seconds, 1),
                        "peak_rss_bytes": r.peaks,
                    }
                )
            )
        return 0
    print()
    print(f"audit all on a standalone cluster ({args.workers} workers x {args.cores} core)")
    for r in runs:
        peaks = ", ".join(f"{k} {_gb(v)}" for k, v in sorted(r.peaks.items()))
        print(f"  {r.records:>12,} records on {r.master}: {r.seconds:7.1f} s; peak RSS {peaks}")
    for size, (_, seconds) in sorted(exports.items()):
        if seconds:
            print(f"  export of {size:,} records: {seconds:.1f} s ({size / seconds:,.0f} rec/s)")
    print(
        f"growth from {counts[part]:,} to {counts[full]:,} records: "
        f"x{full_run.seconds / slice_run.seconds:.1f} for x{counts[full] / counts[part]:.1f} "
        "(cluster)"
    )
    print(
        f"the {counts[part]:,}-record slice: the cluster's answers equal local[2]'s (every "
        "table and summary)"
    )
    print(f"local[2] on the slice: {local_run.seconds:.1f} s")
    print()
    print(full_run.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
