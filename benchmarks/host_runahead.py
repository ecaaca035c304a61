"""How far a step stays above max(host, GPU) when the host is made faster or slower, replayed from
moetune's own traces: the step-time model (estimate/step.py) takes a micro-batch's time as the
larger of its host's launch time and its stream's time, as if the host could always run ahead. A
host that waits on the GPU (a stream or event synchronization, a device-to-host copy: the token
counts a dropless MoE layer's grouped GEMM needs on the host) empties the queue, and the GPU then
waits for the launches after it.

    .venv/bin/python benchmarks/host_runahead.py [--out benchmarks/results/host_runahead.json]

For each trace named in TRACES (the trial bank's, and benchmarks/host_runahead/'s), each profiled iteration of its first rank's
launching thread is read as a sequence of host operations: a launch (the host's own time since its
previous call plus the call, and the GPU time of what it launched), a wait (a synchronizing call,
or a device-to-host copy), or other host work. `replay` runs that sequence with the host's times
scaled so that host / GPU is r, the GPU a single queue (kernels of several streams are serialised:
the overlap of communication with compute is not replayed), with and without the waits. The table
gives step / max(host, GPU) - 1 at each r: what max(host, GPU) leaves out at that balance, for
that trace's code path. The first trace's curve over CURVE_RATIOS is the model's `host_wait_excess` (estimate/rates.py CURVES;
tests/estimate/test_rates.py keeps the two equal).
"""
from __future__ import annotations

import argparse
import functools
import json
import lzma
import sqlite3
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BANK = ROOT / "data" / "trial_bank" / "traces"
HOME = ROOT / "benchmarks" / "host_runahead"  # traces taken for this replay
OUT = ROOT / "benchmarks" / "results" / "host_runahead.json"
# (trace, what it is)
TRACES = ((HOME / "qwen3_30b_a3b_2layer_1gpu.sqlite.xz", "two Qwen3-30B-A3B layers on one H100, EP 1 (TE, grouped "
           "GEMM of its 128 experts, dropless; benchmarks/device/qwen3_30b_a3b_2layer_1gpu.yaml)"),
          (HOME / "moe_proxy_te_1gpu.sqlite.xz", "moe_proxy_te on one H100, EP 1 (TE, grouped GEMM, dropless: "
           "token counts on the host; benchmarks/device/moe_proxy_te_1gpu.yaml)"),
          (BANK / "te_gg.sqlite.xz", "moe_proxy_te on two H200, rank 0 (TE, grouped GEMM, EP 2, dropless; its "
           "all-to-all kernels hold waiting on the other rank)"),
          (BANK / "mbs8_1gpu.sqlite.xz", "moe_proxy on one H200 (local spec, dropless)"),
          (BANK / "qwen3_30b_a3b-1gpu_t1_baseline.sqlite.xz", "qwen3_30b_a3b rank 0 alone on an H100 (TE, grouped "
           "GEMM, capacity 1 with padding: no token counts to wait for)"))
RATIOS = (0.4, 0.65, 0.88, 1.0, 1.5)
# the step-time model's curve (rates.CURVES host_wait_excess): the trace of a production model's
# layers on the recipes' code path (TE, grouped GEMM, the dropless all-to-all) with no peer to wait
# on, at host / GPU ratios from a GPU-bound to a host-bound stage; beyond the last the excess is
# taken as that point's
CURVE_TRACE = TRACES[0][0]
CURVE_RATIOS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.4, 1.6, 2.0, 3.0, 5.0, 10.0)
# calls in which the host waits for the GPU
WAITS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cuStreamSynchronize",
         "cuCtxSynchronize", "cuEventSynchronize")
DTOH = 2  # CUPTI's copyKind of a device-to-host copy: the host waits for the bytes
WAIT_CALL_NS = 3000  # a wait's own cost on the host, beside the waiting
LAUNCHING_SHARE = 0.05  # a thread making fewer of a rank's launches than this is not its host


def host_ops(con: sqlite3.Connection, lo: int, hi: int, tids: list[int], gpu: dict) -> list[tuple[float, str, float]]:
    """(host ns, "launch" | "wait" | "host", GPU ns) of the threads' calls in [lo, hi], in time
    order (the forward's thread and autograd's backward thread take turns): a call's host time is
    the gap since the previous call ended plus the call itself (a wait: plus WAIT_CALL_NS instead of
    its length, which is the waiting)."""
    names = dict(con.execute("SELECT id, value FROM StringIds"))
    marks = ",".join("?" * len(tids))
    rows = con.execute("SELECT start, end, nameId, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME "
                       f"WHERE globalTid IN ({marks}) AND start >= ? AND end <= ? ORDER BY start", (*tids, lo, hi))
    ops, prev = [], lo
    for start, end, name_id, corr in rows:
        gap, name = max(0, start - prev), names[name_id]
        if name.startswith(WAITS):
            ops.append((gap + WAIT_CALL_NS, "wait", 0.0))
        elif corr in gpu:
            ns, kind = gpu[corr]
            ops.append((gap + end - start, "launch", ns))
            if kind == DTOH:
                ops.append((0.0, "wait", 0.0))
        else:
            ops.append((gap + end - start, "host", 0.0))
        prev = end
    return ops


def replay(ops, host_scale: float, gpu_scale: float = 1.0, waits: bool = True) -> float:
    """The step's ns with the host's times x host_scale and the GPU's x gpu_scale: a launch starts
    its work when both the host has issued it and the GPU's queue is free; a wait holds the host
    until the queue is empty (left out with waits=False)."""
    host = gpu = 0.0
    for own, kind, ns in ops:
        host += host_scale * own
        if kind == "launch":
            gpu = max(host, gpu) + gpu_scale * ns
        elif kind == "wait" and waits:
            host = max(host, gpu)
    return max(host, gpu)


def excess(ops, ratio: float, waits: bool = True) -> float:
    """step / max(host, GPU) - 1 with the host scaled so that host / GPU = ratio."""
    h, g = sum(o[0] for o in ops), sum(o[2] for o in ops)
    scale = ratio * g / h
    return replay(ops, scale, 1.0, waits) / max(scale * h, g) - 1


@functools.lru_cache(maxsize=None)  # the curve's trace is also the table's first: read once
def iterations(path: Path) -> list[list[tuple]]:
    """Each profiled iteration's host operations on the first rank's launching threads."""
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "t.sqlite"
        db.write_bytes(lzma.decompress(path.read_bytes()))
        con = sqlite3.connect(db)
        launches = con.execute("SELECT r.globalTid, count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s "
                               "ON s.id = r.nameId WHERE s.value LIKE '%aunch%' GROUP BY r.globalTid").fetchall()
        pids = sorted({tid >> 24 for tid, _ in launches})
        mine = Counter({t: n for t, n in launches if t >> 24 == pids[0]})
        # the threads that launch (the forward's and autograd's backward thread), not a stray one
        tids = [t for t, n in mine.items() if n >= LAUNCHING_SHARE * sum(mine.values())]
        gpu = {}
        for table, kind in (("CUPTI_ACTIVITY_KIND_KERNEL", "0"), ("CUPTI_ACTIVITY_KIND_MEMCPY", "copyKind"),
                            ("CUPTI_ACTIVITY_KIND_MEMSET", "0")):
            for start, end, corr, k in con.execute(f"SELECT start, end, correlationId, {kind} FROM {table} "
                                                   f"WHERE globalPid >> 24 = ?", (pids[0],)):
                gpu[corr] = (end - start, k)
        windows = con.execute("SELECT start, end FROM NVTX_EVENTS WHERE text LIKE 'iteration%' AND globalTid >> 24 = ? "
                              "ORDER BY start", (pids[0],)).fetchall()
        out = [host_ops(con, lo, hi, tids, gpu) for lo, hi in windows]
        con.close()
    return out


def measure() -> list[dict]:
    rows = []
    for path, what in TRACES:
        its = iterations(path)
        med = lambda f: round(statistics.median(f(ops) for ops in its), 4)  # noqa: E731
        rows.append({"trace": path.name.removesuffix(".sqlite.xz"), "what": what, "iterations": len(its),
                     "host_ms": med(lambda o: sum(x[0] for x in o) / 1e6), "gpu_ms": med(lambda o: sum(x[2] for x in o) / 1e6),
                     "waits": med(lambda o: sum(x[1] == "wait" for x in o)),
                     "with_waits": {str(r): med(lambda o, r=r: excess(o, r)) for r in RATIOS},
                     "without_waits": {str(r): med(lambda o, r=r: excess(o, r, waits=False)) for r in RATIOS}})
    return rows


def curve(its: list[list[tuple]] | None = None) -> tuple[tuple[float, float], ...]:
    """(host / GPU, step / max(host, GPU) - 1) of CURVE_TRACE, median over its iterations."""
    its = its if its is not None else iterations(CURVE_TRACE)
    return tuple((r, round(statistics.median(excess(o, r) for o in its), 4)) for r in CURVE_RATIOS)


def table(rows: list[dict]) -> str:
    head = "| trace | host ms | GPU ms | waits an iteration | " + " | ".join(f"host/GPU {r}" for r in RATIOS) + " |"
    lines = [head, "|" + "---|" * (4 + len(RATIOS))]
    for r in rows:
        cells = [f"+{r['with_waits'][str(x)]:.0%} (+{r['without_waits'][str(x)]:.0%})" for x in RATIOS]
        lines.append(f"| {r['trace']} | {r['host_ms']:.0f} | {r['gpu_ms']:.0f} | {r['waits']:.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    rows, points = measure(), curve()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"traces": rows, "curve": {"trace": str(CURVE_TRACE.relative_to(ROOT)),
                                                           "points": points}}, indent=1) + "\n")
    print(table(rows))
    print("step / max(host, GPU) - 1, median over the profiled iterations; in brackets without the waits")
    print(f"curve ({CURVE_TRACE.name}): " + ", ".join(f"{r}: {e}" for r, e in points))
    return 0


if __name__ == "__main__":
    sys.exit(main())
