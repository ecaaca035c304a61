"""Benchmark: moetune's whole analysis vs `nsys stats` and vs a raw columnar read, on a synthetic
8-rank trace of 2 M kernels; and the per-rank map on a 64-rank trace set (one file per rank).

    .venv/bin/python benchmarks/analysis.py [--kernels 2000000] [--ranks 8] [--repeat 3]
                                            [--set-ranks 64 --set-kernels 500000 --set-compare 16]

The trace uses the real Nsight Systems export schema (tests/nsys_fixture.py's tables): per rank a
steady pattern of GEMMs, MoE permutes, NCCL SendRecv all-to-all and small elementwise kernels, each
launched by a cudaLaunchKernel call, with NVTX iteration ranges. On the 8-rank file, in one run and
alternating: moetune's analysis (a fresh process, default workers), `nsys stats` kern_sum, and a raw
read of the kernel and runtime columns moetune needs by connectorx (the reader moetune uses); once,
the reader candidates (connectorx, adbc-driver-sqlite, Python's sqlite3) on those columns. The
trace set: whole analysis with 1 and 2 worker processes, on the first `--set-compare` ranks and on
all, to show that peak memory does not grow with the ranks. Peak memory: the largest sum, over the
process tree, of each process's proportional set size (PSS: pages shared by forked workers count
once), sampled every 20 ms in runs of their own (the sampler slows what it watches; timed runs are
not sampled). Writes benchmarks/results/analysis.json and the `## Trace analysis
speed` section of docs/benchmarks.md.
"""
import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(1, str(REPO))  # tests.nsys_fixture: the export schema
import checkout  # noqa: E402,F401  (moetune from this checkout)
from tests.nsys_fixture import PID, SCHEMA_2025  # noqa: E402

NAMES = ["nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_TNT", "moe_permute_kernel",
         "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "vectorized_elementwise_kernel",
         "flash_fwd_kernel", "moe_unpermute_kernel", "topk_router_kernel", "rmsnorm_fwd_kernel"]
DUR_NS = np.array([400_000, 20_000, 150_000, 5_000, 120_000, 20_000, 8_000, 6_000])
KERNEL_SQL = ('SELECT start, "end", deviceId, streamId, correlationId, globalPid, shortName, demangledName '
              "FROM CUPTI_ACTIVITY_KIND_KERNEL")
RUNTIME_SQL = 'SELECT start, "end", globalTid, correlationId, nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME'


def build(path: Path, kernels: int, ranks: int, seed: int = 0, first_rank: int = 0) -> None:
    """`ranks` processes of kernels // ranks kernels each (pids and GPUs from `first_rank` on)."""
    rng = np.random.default_rng(seed)
    path.unlink(missing_ok=True)
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=OFF")
    con.execute("PRAGMA synchronous=OFF")
    for table, cols in SCHEMA_2025.items():
        con.execute(f"CREATE TABLE {table} ({cols})")
    con.executemany("INSERT INTO StringIds VALUES (?, ?)",
                    [(i + 1, n) for i, n in enumerate(NAMES)] + [(100, "cudaLaunchKernel_v7000")] +
                    [(200 + i, f"iteration {i}") for i in range(1000)])
    con.execute("INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_PROGRAM_VERSION', '2025.3.2')")
    per_rank = kernels // ranks
    step_kernels = 2000
    corr = 0
    for r in range(first_rank, first_rank + ranks):
        pid = PID + (r << 24)
        kind = rng.integers(0, len(NAMES), per_rank)
        dur = (DUR_NS[kind] * rng.uniform(0.8, 1.2, per_rank)).astype(np.int64)
        gap = rng.exponential(3_000, per_rank).astype(np.int64)
        start = np.cumsum(dur + gap) - dur
        end = start + dur
        ids = np.arange(corr + 1, corr + per_rank + 1)
        corr += per_rank
        con.executemany('INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, "end", deviceId, streamId, '
                        "correlationId, globalPid, demangledName, shortName) VALUES (?,?,?,?,?,?,?,?)",
                        zip(start.tolist(), end.tolist(), [r % 8] * per_rank, [7] * per_rank, ids.tolist(),
                            [pid] * per_rank, (kind + 1).tolist(), (kind + 1).tolist()))
        launch = start - rng.integers(5_000, 50_000, per_rank)
        con.executemany('INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, "end", eventClass, globalTid, '
                        "correlationId, nameId) VALUES (?,?,1,?,?,100)",
                        zip(launch.tolist(), (launch + 3_000).tolist(), [pid + 1] * per_rank, ids.tolist()))
        steps = [(int(launch[i]), int(launch[min(i + step_kernels, per_rank - 1)]), pid + 1, 200 + n)
                 for n, i in enumerate(range(0, per_rank - step_kernels, step_kernels))]
        con.executemany('INSERT INTO NVTX_EVENTS (start, "end", eventType, globalTid, textId) '
                        "VALUES (?,?,59,?,?)", steps)
    con.commit()
    con.close()



def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_pss_kib(pid: int) -> int:
    """PSS of a process and all its descendants (forked workers' shared pages count once)."""
    todo, total = [pid], 0
    while todo:
        p = todo.pop()
        total += _pss_kib(p)
        todo += _children(p)
    return total


def run_measured(cmd: list[str], env=None, sample: bool = True) -> tuple[float, float, subprocess.CompletedProcess]:
    """(seconds, peak GB of the process tree's PSS, the finished process). The sampler slows what it
    measures (reading smaps_rollup walks the page tables under the process's memory lock, which its
    page faults wait for: 0.3-0.6 s on the 8-rank analysis), so `sample=False` times a run alone."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = [0]
    done = threading.Event()

    def sample_pss():
        while not done.is_set():
            peak[0] = max(peak[0], tree_pss_kib(proc.pid))
            done.wait(0.02)
    th = threading.Thread(target=sample_pss if sample else done.wait, daemon=True)
    th.start()
    out, err = proc.communicate()
    seconds = time.perf_counter() - t0
    done.set()
    th.join()
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:3]} failed: {err[-800:]}")
    return seconds, peak[0] / 2**20, subprocess.CompletedProcess(cmd, proc.returncode, out, err)


OURS = ("import sys, json, checkout; from moetune import analysis; w = None if sys.argv[1] == 'auto' else int(sys.argv[1]);"
        "r = analysis.analyze(sys.argv[2:], workers=w);"
        "import resource; m = lambda who: resource.getrusage(who).ru_maxrss / 2**20;"
        "print(json.dumps({'wall': r['wall'], 'ranks': r['metrics']['combined']['ranks'],"
        "'maxrss_gb': m(resource.RUSAGE_SELF), 'maxrss_worker_gb': m(resource.RUSAGE_CHILDREN)}))")
READ = {  # each reads the kernel and runtime columns moetune needs, whole tables, one after the other
    "connectorx": ("import sys, connectorx as cx; u = 'sqlite://' + sys.argv[1];"
                   "n = [cx.read_sql(u, q, return_type='arrow').num_rows for q in sys.argv[2:]]"),
    "adbc-driver-sqlite": ("import sys, adbc_driver_sqlite.dbapi as a; con = a.connect(sys.argv[1]); n = []\n"
                           "for q in sys.argv[2:]:\n cur = con.cursor(); cur.execute(q); "
                           "n.append(cur.fetch_arrow_table().num_rows); cur.close()"),
    "sqlite3": ("import sys, sqlite3, itertools, numpy as np;"
                "con = sqlite3.connect(f'file:{sys.argv[1]}?mode=ro&immutable=1', uri=True);"
                "n = [np.fromiter(itertools.chain.from_iterable(con.execute(q)), dtype=np.int64).size"
                " for q in sys.argv[2:]]"),
}


def _version(pkg: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(pkg)
    except PackageNotFoundError:
        return None


def trace_set(work: Path, ranks: int, kernels: int) -> tuple[list[Path], float]:
    """One file per rank, `kernels` kernels each, made once (kept under `work` for the next run)."""
    d = work / f"set_{ranks}x{kernels}"
    files = [d / f"rank_{r:03d}.sqlite" for r in range(ranks)]
    if not (d / "done").exists():
        t0 = time.perf_counter()
        d.mkdir(parents=True, exist_ok=True)
        for r, f in enumerate(files):
            build(f, kernels, 1, seed=1000 + r, first_rank=r)
        (d / "done").write_text(f"{time.perf_counter() - t0:.1f}")  # the time it took, for the table
    return files, float((d / "done").read_text())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", type=int, default=2_000_000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--set-ranks", type=int, default=64)
    ap.add_argument("--set-kernels", type=int, default=500_000)
    ap.add_argument("--set-compare", type=int, default=16, help="also run on this many of the set's ranks")
    ap.add_argument("--note", default="", help="said beside the figures (e.g. the machine is shared)")
    ap.add_argument("--doc-only", action="store_true", help="rewrite docs/benchmarks.md from the result file")
    args = ap.parse_args()
    if args.doc_only:  # e.g. to say more beside the figures (--note); the figures stay the run's
        r = json.loads((REPO / "benchmarks" / "results" / "analysis.json").read_text())
        r["note"] = args.note or r["note"]
        (REPO / "benchmarks" / "results" / "analysis.json").write_text(json.dumps(r, indent=1))
        return write_doc(r, args)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "moetune-bench"
    work.mkdir(exist_ok=True)
    trace = work / "synthetic_8rank.sqlite"
    t0 = time.perf_counter()
    build(trace, args.kernels, args.ranks)
    build_s = time.perf_counter() - t0
    env_py = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "benchmarks"), str(REPO)]))  # checkout: this tree's moetune
    py = sys.executable
    nsys = shutil.which("nsys")
    stats_report = None
    if nsys:  # the report's name changed between Nsight versions
        for report in ("cuda_gpu_kern_sum", "gpukernsum"):
            q = subprocess.run([nsys, "stats", "--report", report, "--format", "csv", "--force-export", "false",
                                str(trace)], capture_output=True, text=True)
            if q.returncode == 0 and "Time" in q.stdout:
                stats_report = report
                break
    readers = {}
    for name, code in READ.items():  # the candidates, once each, on the same columns
        if name == "sqlite3" or _version(name if name != "connectorx" else "connectorx"):
            s, gb, _ = run_measured([py, "-c", code, str(trace), KERNEL_SQL, RUNTIME_SQL], env_py)
            readers[name] = {"s": round(s, 2), "peak_gb": round(gb, 3),
                             "version": _version(name) if name != "sqlite3" else sqlite3.sqlite_version}
    runs = {"moetune": [], "nsys_stats": [], "raw_read": []}
    peak = {"moetune": 0.0, "raw_read": 0.0}
    ours = None
    ours_cmd = [py, "-c", OURS, "auto", str(trace)]
    raw_cmd = [py, "-c", READ["connectorx"], str(trace), KERNEL_SQL, RUNTIME_SQL]
    loads = [os.getloadavg()[0]]
    for _ in range(args.repeat):  # alternate the three, timed alone (no memory sampler); medians
        s, _, p = run_measured(ours_cmd, env_py, sample=False)
        runs["moetune"].append(s)
        ours = json.loads(p.stdout.strip().splitlines()[-1])
        s, _, _ = run_measured(raw_cmd, env_py, sample=False)
        runs["raw_read"].append(s)
        if stats_report:
            s, _, _ = run_measured([nsys, "stats", "--report", stats_report, "--format", "csv", "--force-export",
                                    "false", str(trace)], sample=False)
            runs["nsys_stats"].append(s)
        loads.append(os.getloadavg()[0])
    for _ in range(2):  # peak memory: sampled runs of their own
        peak["moetune"] = max(peak["moetune"], run_measured(ours_cmd, env_py)[1])
        peak["raw_read"] = max(peak["raw_read"], run_measured(raw_cmd, env_py)[1])
    med = {k: round(float(np.median(v)), 2) if v else None for k, v in runs.items()}
    files, set_build_s = trace_set(work, args.set_ranks, args.set_kernels)
    sets = []
    for n in sorted({min(args.set_compare, len(files)), len(files)}):
        for workers in (1, 2):
            s, gb, p = run_measured([py, "-c", OURS, str(workers), *map(str, files[:n])], env_py)
            got = json.loads(p.stdout.strip().splitlines()[-1])
            assert got["ranks"] == n, got
            sets.append({"ranks": n, "kernels_per_rank": args.set_kernels, "workers": workers,
                         "s": round(s, 2), "peak_gb": round(gb, 3), "maxrss_gb": round(got["maxrss_gb"], 3),
                         "maxrss_worker_gb": round(got["maxrss_worker_gb"], 3)})
    result = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()), "workers": "default (analysis.ranks.default_workers)",
        "kernels": args.kernels, "ranks": args.ranks, "build_s": round(build_s, 1), "repeat": args.repeat,
        "cores": len(os.sched_getaffinity(0)), "note": args.note,
        "load_1min": [round(x, 2) for x in loads],  # before the runs and after each round (others' work)
        "moetune_s": med["moetune"], "nsys_stats_s": med["nsys_stats"], "raw_read_s": med["raw_read"],
        "runs_s": {k: [round(x, 2) for x in v] for k, v in runs.items()},
        "moetune_peak_gb": round(peak["moetune"], 3), "raw_read_peak_gb": round(peak["raw_read"], 3),
        "moetune_wall": ours["wall"], "nsys_stats_report": stats_report,
        "nsys": subprocess.run([nsys, "--version"], capture_output=True, text=True).stdout.strip() if nsys else None,
        "readers": readers,
        "trace_set": {"ranks": args.set_ranks, "kernels_per_rank": args.set_kernels,
                      "disk_gb": round(sum(f.stat().st_size for f in files) / 2**30, 2),
                      "build_s": round(set_build_s, 1), "runs": sets},
    }
    ratio_stats = round(med["moetune"] / med["nsys_stats"], 2) if med["nsys_stats"] else None
    ratio_raw = round(med["moetune"] / med["raw_read"], 2)
    result.update(vs_nsys_stats=ratio_stats, vs_raw_read=ratio_raw)
    (REPO / "benchmarks" / "results").mkdir(exist_ok=True)
    (REPO / "benchmarks" / "results" / "analysis.json").write_text(json.dumps(result, indent=1))
    write_doc(result, args)
    print(json.dumps(result, indent=1))


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def write_doc(r: dict, args) -> None:
    ts = r["trace_set"]
    small, big = min(x["ranks"] for x in ts["runs"]), max(x["ranks"] for x in ts["runs"])
    pk = {(x["ranks"], x["workers"]): x for x in ts["runs"]}
    # exact per process (max RSS of the main process and of the largest worker): the sampled sum
    # over the tree also depends on whether two workers' peaks happen to coincide
    flat = all(pk[(big, w)][k] <= 1.1 * pk[(small, w)][k] for w in (1, 2) for k in ("maxrss_gb", "maxrss_worker_gb"))
    lines = [
        "## Trace analysis speed\n",
        f"`benchmarks/analysis.py` ({r.get('date', time.strftime('%Y-%m-%d', time.gmtime()))}, {r['cores']} cores"
        + (f"; {r['note']}" if r["note"] else "") + "). A synthetic "
        f"{r['ranks']}-rank trace of {r['kernels']:,} kernels in the real export schema (kernels, launches,",
        "NVTX steps), one file. moetune's whole analysis (a fresh process: read each rank's rows, windows,",
        f"every metric, the all-to-all split, the wall; default workers: one per core, here {min(r['cores'], 8)}) against `nsys stats`",
        "and against a raw columnar read (connectorx) of the kernel and runtime columns moetune needs, same",
        f"file, alternating, median of {r['repeat']} (all runs in benchmarks/results/analysis.json"
        + (f"; 1-minute load average {min(r['load_1min'])}-{max(r['load_1min'])} during them" if r.get("load_1min") else "")
        + "). Timed runs are not sampled;",
        "peak memory: the process tree's PSS (shared pages of forked workers once), sampled every 20 ms in",
        "two separate runs (the sampler slows the runs it watches).\n",
        "| what | seconds | peak memory |", "|---|---|---|",
        f"| moetune analyze (all metrics + wall) | {r['moetune_s']} | {r['moetune_peak_gb']} GB |",
        f"| `nsys stats --report {r['nsys_stats_report']}` ({r['nsys']}) | {r['nsys_stats_s']} | - |",
        f"| raw read of the columns (connectorx) | {r['raw_read_s']} | {r['raw_read_peak_gb']} GB |\n",
        f"moetune / nsys stats = {r['vs_nsys_stats']} (goal <= 0.4: {_met((r['vs_nsys_stats'] or 9) <= 0.4)}); "
        f"moetune / raw read = {r['vs_raw_read']} (goal <= 2: {_met(r['vs_raw_read'] <= 2)}); "
        f"peak under 1 GB: {_met(r['moetune_peak_gb'] < 1)}.\n",
        "Reader candidates, the same columns of the same file, one process each (start-up included):\n",
        "| reader | version | seconds | peak memory |", "|---|---|---|---|",
        *[f"| {n} | {x['version']} | {x['s']} | {x['peak_gb']} GB |" for n, x in r["readers"].items()],
        "",
        f"Trace set: {ts['ranks']} files, one rank each, {ts['kernels_per_rank']:,} kernels a rank "
        f"({ts['disk_gb']} GB on disk, made in {ts['build_s']} s the first time), the same generator; whole",
        "analysis of the first ranks and of all, with 1 and 2 worker processes:\n",
        "| ranks | workers | seconds | peak memory (PSS, tree) | max RSS: main process, largest worker |",
        "|---|---|---|---|---|",
        *[f"| {x['ranks']} | {x['workers']} | {x['s']} | {x['peak_gb']} GB | {x['maxrss_gb']} GB, "
          f"{str(x['maxrss_worker_gb']) + ' GB' if x['workers'] > 1 else '-'} |" for x in ts["runs"]],
        "",
        f"Max RSS of the main process and of the largest worker at {big} ranks within 10% of {small} ranks:",
        f"{_met(flat)}. The main process keeps",
        "each rank's metrics and, in a temporary folder, its all-to-all kernel starts (16 bytes a kernel;",
        "every 8th kernel of this generator is one): memory is that of the tasks in flight. The sampled",
        "PSS may miss a short peak; max RSS is exact per process (shared pages counted in each).\n",
    ]
    doc = REPO / "docs" / "benchmarks.md"
    text = doc.read_text()
    head, _, rest = text.partition("## Trace analysis speed")
    tail = rest[rest.find("\n## "):] if "\n## " in rest else ""
    doc.write_text(head + "\n".join(lines) + tail)


if __name__ == "__main__":
    main()
