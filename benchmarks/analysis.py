"""Benchmark: moetune's whole analysis vs `nsys stats` on a synthetic 8-rank trace of >= 2 M kernels.

    .venv/bin/python benchmarks/analysis.py [--kernels 2000000] [--ranks 8]

The trace uses the real Nsight Systems export schema (tests/nsys_fixture.py's tables): per rank a
steady pattern of GEMMs, MoE permutes, NCCL SendRecv all-to-all and small elementwise kernels, each
launched by a cudaLaunchKernel call, with NVTX iteration ranges. Both tools run on the same file in
the same process tree, one after the other; peak memory is the analysis process's max RSS.
Writes benchmarks/results/analysis.json and the `## Trace analysis speed` section of docs/benchmarks.md.
"""
import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import checkout  # noqa: E402,F401  (moetune from this checkout)
from tests.nsys_fixture import PID, SCHEMA_2025  # noqa: E402

NAMES = ["nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_TNT", "moe_permute_kernel",
         "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "vectorized_elementwise_kernel",
         "flash_fwd_kernel", "moe_unpermute_kernel", "topk_router_kernel", "rmsnorm_fwd_kernel"]
DUR_NS = np.array([400_000, 20_000, 150_000, 5_000, 120_000, 20_000, 8_000, 6_000])


def build(path: Path, kernels: int, ranks: int, seed: int = 0) -> None:
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
    for r in range(ranks):
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
                        zip(start.tolist(), end.tolist(), [r] * per_rank, [7] * per_rank, ids.tolist(),
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", type=int, default=2_000_000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "moetune-bench"
    work.mkdir(exist_ok=True)
    trace = work / "synthetic_8rank.sqlite"
    t0 = time.perf_counter()
    build(trace, args.kernels, args.ranks)
    build_s = time.perf_counter() - t0
    ours_cmd = [sys.executable, "-c",
                "import sys, json, resource, analysis;"
                "r = analysis.analyze([sys.argv[1]]);"
                "print(json.dumps({'wall': r['wall'], 'ranks': r['metrics']['combined']['ranks'],"
                "'rss_kib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss"
                " + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))", str(trace)]
    env_py = dict(os.environ, PYTHONPATH=str(REPO))
    nsys = shutil.which("nsys")
    stats_report = None
    if nsys:  # the report's name changed between Nsight versions
        for report in ("cuda_gpu_kern_sum", "gpukernsum"):
            q = subprocess.run([nsys, "stats", "--report", report, "--format", "csv", "--force-export", "false",
                                str(trace)], capture_output=True, text=True)
            if q.returncode == 0 and "Time" in q.stdout:
                stats_report = report
                break
    ours_runs, stats_runs = [], []
    for _ in range(args.repeat):  # alternate the two tools; report medians
        t0 = time.perf_counter()
        p = subprocess.run(ours_cmd, capture_output=True, text=True, env=env_py)
        ours_runs.append(time.perf_counter() - t0)
        if p.returncode != 0:
            raise SystemExit(f"analysis failed: {p.stderr[-500:]}")
        ours = json.loads(p.stdout.strip().splitlines()[-1])
        if stats_report:
            t0 = time.perf_counter()
            subprocess.run([nsys, "stats", "--report", stats_report, "--format", "csv", "--force-export",
                            "false", str(trace)], capture_output=True, text=True, check=True)
            stats_runs.append(time.perf_counter() - t0)
    ours_s = float(np.median(ours_runs))
    stats_s = float(np.median(stats_runs)) if stats_runs else None
    result = {"kernels": args.kernels, "ranks": args.ranks, "build_s": round(build_s, 1),
              "moetune_s": round(ours_s, 2), "moetune_runs_s": [round(x, 2) for x in ours_runs],
              "nsys_stats_runs_s": [round(x, 2) for x in stats_runs], "moetune_peak_rss_gb": round(ours["rss_kib"] / 2**20, 3),
              "moetune_wall": ours["wall"], "nsys_stats_s": round(stats_s, 2) if stats_s else None,
              "nsys_stats_report": stats_report, "nsys": subprocess.run([nsys, "--version"], capture_output=True,
                                                                         text=True).stdout.strip() if nsys else None}
    (REPO / "benchmarks" / "results").mkdir(exist_ok=True)
    (REPO / "benchmarks" / "results" / "analysis.json").write_text(json.dumps(result, indent=1))
    section = (
        "## Trace analysis speed\n\n"
        f"`benchmarks/analysis.py`: a synthetic {args.ranks}-rank trace of {args.kernels:,} kernels in the real export\n"
        "schema (kernels, launches, NVTX steps). moetune's whole analysis (load, per-rank windows, every metric,\n"
        "the wall) against `nsys stats` on the same file, same run, on this 2-core CI-class machine:\n\n"
        f"Median of {args.repeat} alternating runs each (all runs in benchmarks/results/analysis.json).\n\n"
        "| what | seconds | peak memory |\n|---|---|---|\n"
        f"| moetune analyze (all metrics + wall) | {result['moetune_s']} | {result['moetune_peak_rss_gb']} GB |\n"
        f"| `nsys stats --report {stats_report}` ({result['nsys']}) | {result['nsys_stats_s']} | - |\n\n"
        f"Goal: moetune faster than `nsys stats` and under 2 GB: "
        f"{'met' if stats_s and ours_s < stats_s and result['moetune_peak_rss_gb'] < 2 else 'NOT met'}.\n")
    doc = REPO / "docs" / "benchmarks.md"
    text = doc.read_text()
    head, _, rest = text.partition("## Trace analysis speed")
    tail = rest[rest.find("\n## "):] if "\n## " in rest else ""
    doc.write_text(head + section + tail)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
