"""moetune's figures beside NVIDIA's Nsight Systems recipes (`nsys recipe`, Nsight Systems 2023.x and
later), which performance engineers already trust: where both read one report, they must agree.

    read_recipes(folder)              -> what the recipes' outputs say (kernel time by name, GPU busy,
                                          NCCL time under compute)
    kernel_ms_by_name(kernels)        -> moetune's kernel time by (short) name, from its kernel frame
    busy_share(ops, lo, hi)           -> moetune's GPU busy share over [lo, hi): the union of the GPU's
                                          kernels, memory copies and memsets (its gpu_busy_share)
    in_use_share(ops, lo, hi)         -> the same operations by gpu_time_util's rule (below)
    compare(trace, folder)            -> both side by side, and each disagreement as a line
    check_report(nsys, report, sqlite) -> the recipes run on a report (where this nsys has them)
                                          and compare() of its SQLite: what <report>.recipes.json holds

The recipes read (their output folders, named as the recipes are):
    cuda_gpu_kern_sum/all_stats.parquet   Name, Sum (ns): each kernel name's total time
    gpu_time_util/analysis.parquet        Start, Duration (ns), In-Use (%) per process (PID) and
                                          device: busy share
    nccl_gpu_overlap_trace/rank_trace.parquet
                                          Start, End, PID, DeviceID, Compute Overlap (%) per kernel:
                                          NCCL time under compute, against moetune's comm_exposure

Where the two differ by design, compare() states the rule and applies it:
- names: moetune qualifies a kernel's name with its namespace (at::native::reduce_kernel), the
  recipe uses the short name (reduce_kernel): they are compared on the part after the last `::`;
- window: the recipes cover the whole report, moetune's metrics the profiled steps; the comparison
  takes the recipe's window (for gpu_time_util, [Start, Start + Duration)), over all kernels;
- busy: gpu_time_util counts as in use the GPU operations of the recipe row's process on its device
  (kernels, memory copies and memsets, and the CUDA profiling overheads the recipe adds) and sums
  each one's time inside the window: operations that run at once (streams, copies beside kernels)
  each count, so In-Use exceeds the union wherever they overlap (on Megatron MoE ranks by up to 12.5
  points). moetune's busy share is the union; the comparison applies the recipe's sum
  (in_use_share) and shows the union beside it. In-Use is a percentage with one decimal: its
  rounding is within the tolerance;
- graphs: where CUDA graphs were traced as whole graphs (nsys --cuda-graph-trace=graph, the
  default), their kernels are in neither moetune's kernel table nor the recipes' inputs: both
  sides miss the graphs' time alike. The comparison says so in `notes`, and a busy figure that
  disagrees there is a note with that cause, not a disagreement.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd

from moetune.analysis import intervals as iv
from moetune.analysis.errors import TraceError
from moetune.analysis.kernels import classify
from moetune.analysis.load import GRAPHS_WHOLE, connect, graphs_traced_whole, read_trace, tables_of
from moetune.analysis.metrics import comm_exposure
from moetune.analysis.nsys import has_recipes, version

RECIPES = ("cuda_gpu_kern_sum", "gpu_time_util", "nccl_gpu_overlap_trace")
KERNEL_TOLERANCE = 0.01  # relative, per kernel name
BUSY_TOLERANCE = 0.02  # absolute, as a share of the window
OVERLAP_TOLERANCE = 0.02  # absolute, as a share of the NCCL kernels' time


def short_name(name: str) -> str:
    return str(name).rsplit("::", 1)[-1]


def read_recipes(folder: str | Path) -> dict:
    """{"kernel_ms": {short name: ms}, "busy": [{"device", "pid", "start_ns", "duration_ns", "busy_share"}],
    "nccl_overlap": nccl_overlap_rows()} (busy in time order; pid None where the output has no PID
    column); a recipe whose output is absent (no data of its kind in the report) is left out."""
    folder = Path(folder)
    out: dict = {}
    kern = folder / "cuda_gpu_kern_sum" / "all_stats.parquet"
    util = folder / "gpu_time_util" / "analysis.parquet"
    nccl = folder / "nccl_gpu_overlap_trace" / "rank_trace.parquet"
    try:
        if nccl.exists():
            out["nccl_overlap"] = nccl_overlap_rows(pd.read_parquet(nccl))
        if kern.exists():
            df = pd.read_parquet(kern)
            names = df.index if "Name" not in df.columns else df["Name"]
            out["kernel_ms"] = {str(n): float(s) / 1e6 for n, s in zip(names, df["Sum"], strict=True)}
        if util.exists():
            df = pd.read_parquet(util)
            out["busy"] = [{"device": int(r["Device ID"]), "pid": int(r["PID"]) if "PID" in r else None,
                            "start_ns": int(r["Start"]), "duration_ns": int(r["Duration"]),
                            "busy_share": float(r["In-Use"]) / 100}
                           for r in df.sort_values("Start").to_dict("records")]
    except (OSError, KeyError, ValueError) as e:
        raise TraceError(f"{folder}: not a recipe output this moetune reads ({e})") from None
    return out


def nccl_overlap_rows(trace: pd.DataFrame) -> list[dict]:
    """nccl_gpu_overlap_trace's rank_trace (a row a kernel: Start, End, PID, DeviceID and, for an
    NCCL kernel, `Compute Overlap`, the % of it that compute kernels cover) per process and device:
    the NCCL kernels' time and the share of it covered, weighted by each kernel's duration (as the
    recipe's grouped_trace weighs its per-name figure)."""
    df = trace.reset_index() if "Name" not in trace.columns else trace
    df = df[df["Name"].astype(str).str.contains("nccl", case=False)]
    out = []
    for (pid, dev), g in df.groupby(["PID", "DeviceID"]):
        dur = (g["End"] - g["Start"]).to_numpy(np.float64)
        if dur.sum() > 0:
            out.append({"device": int(dev), "pid": int(pid), "nccl_ms": float(dur.sum()) / 1e6,
                        "overlap_share": float((g["Compute Overlap"].to_numpy() * dur).sum() / dur.sum()) / 100})
    return out


def comm_overlap_share(kernels: pd.DataFrame) -> tuple[float, float]:
    """(communication ms, the share of it that compute covers) by moetune's own rule (metrics.py
    comm_exposure: classified kernels, 1 - exposed_comm / comm), for one process on one GPU."""
    ce = comm_exposure(kernels.assign(cls=classify(kernels["name"])))
    share = 1 - ce["exposed_comm_ns"] / ce["comm_ns"] if ce["comm_ns"] else 0.0
    return ce["comm_ns"] / 1e6, share


def kernel_ms_by_name(kernels: pd.DataFrame) -> dict[str, float]:
    names = kernels["name"].astype(str).map(short_name)
    return {n: float(v) / 1e6 for n, v in (kernels["end"] - kernels["start"]).groupby(names).sum().items()}


PROFILING_OVERHEADS = ("CUDA profiling overhead", "CUDA profiling data flush overhead",
                       "CUDA profiling stop overhead")  # what gpu_time_util counts in use besides CUDA's work


def pid_of(global_pid):
    """The process id inside nsys's globalPid (bits 24-47), as the recipes' PID column has it."""
    return (np.asarray(global_pid, dtype=np.int64) >> 24) & 0xFFFFFF


def busy_share(ops: pd.DataFrame, lo: int, hi: int) -> float:
    u = iv.clip(iv.union(ops["start"].to_numpy(np.int64), ops["end"].to_numpy(np.int64)), lo, hi)
    return iv.length(u) / (hi - lo) if hi > lo else 0.0


def in_use_share(ops: pd.DataFrame, lo: int, hi: int) -> float:
    """gpu_time_util's In-Use over [lo, hi): each operation's time inside it, summed."""
    s = np.maximum(ops["start"].to_numpy(np.int64), lo)
    e = np.minimum(ops["end"].to_numpy(np.int64), hi)
    return float(np.clip(e - s, 0, None).sum()) / (hi - lo) if hi > lo else 0.0


def profiling_overheads(con, tables) -> pd.DataFrame:
    """The CUDA profiling overheads of PROFILER_OVERHEAD (start, end, pid): a process's overhead
    counts on each of its GPUs. Slimmed exports leave the table out: none."""
    if "PROFILER_OVERHEAD" not in tables:
        return pd.DataFrame(columns=["start", "end", "pid"])
    names = ",".join(f"'{n}'" for n in PROFILING_OVERHEADS)
    df = pd.read_sql_query(f'SELECT o.start, o."end", o.globalTid FROM PROFILER_OVERHEAD o JOIN StringIds s '
                           f'ON s.id = o.nameId WHERE s.value IN ({names})', con)
    return pd.DataFrame({"start": df["start"], "end": df["end"], "pid": pid_of(df["globalTid"])})


def gpu_ops(trace) -> pd.DataFrame:
    """Every kernel, memory copy and memset of a loaded trace: start end deviceId pid. Rows with no
    start time are left out, as the recipes leave them."""
    cols = ["start", "end", "deviceId", "globalPid"]
    ops = pd.concat([f[cols] for f in (trace.kernels, trace.copies) if not f.empty] or
                    [pd.DataFrame(columns=cols)], ignore_index=True).astype(np.int64)
    ops = ops[ops["start"] > 0]
    return ops.assign(pid=pid_of(ops.pop("globalPid")))


def recipe_ops(ops: pd.DataFrame, overheads: pd.DataFrame, b: dict) -> pd.DataFrame:
    """What gpu_time_util counts for one of its rows: the row's process's operations on its device,
    and that process's profiling overheads strictly inside their span."""
    mine = of_process(ops[ops["deviceId"] == b["device"]], b["pid"])
    over = of_process(overheads, b["pid"])
    if mine.empty or over.empty:
        return mine
    lo, hi = mine["start"].min(), mine["end"].max()
    over = over[(over["start"] > lo) & (over["end"] < hi)]
    return pd.concat([mine[["start", "end"]], over[["start", "end"]]], ignore_index=True)


def of_process(df: pd.DataFrame, pid: int | None) -> pd.DataFrame:
    return df if pid is None else df[df["pid"] == pid]


def compare(trace: str | Path, folder: str | Path) -> dict:
    """moetune's figures of one report beside its recipes' outputs in `folder`; `disagreements`
    lists each figure outside its tolerance (empty: they agree), `notes` what the report's capture
    leaves out of both sides."""
    recipes = read_recipes(folder)
    with connect(trace) as (con, local):
        t = read_trace(con, Path(trace), local)  # the loader open_trace() uses, on this one connection
        tables = tables_of(con, Path(trace))
        whole_graphs = graphs_traced_whole(con, tables)
        overheads = profiling_overheads(con, tables)
    out: dict = {"kernels": [], "busy": [], "nccl_overlap": [], "disagreements": [],
                 "notes": [GRAPHS_WHOLE] if whole_graphs else []}
    ours = kernel_ms_by_name(t.kernels)
    for name, theirs in sorted((recipes.get("kernel_ms") or {}).items(), key=lambda kv: -kv[1]):
        mine = ours.get(name, 0.0)
        rel = abs(mine - theirs) / theirs if theirs else float(mine > 0)
        out["kernels"].append({"name": name, "moetune_ms": round(mine, 4), "recipe_ms": round(theirs, 4),
                               "rel_diff": round(rel, 5)})
        if rel > KERNEL_TOLERANCE:
            out["disagreements"].append(f"kernel {name}: moetune {mine:.3f} ms, cuda_gpu_kern_sum "
                                        f"{theirs:.3f} ms ({rel:.1%} apart)")
    ops = gpu_ops(t)
    for b in recipes.get("busy") or []:
        lo, hi = b["start_ns"], b["start_ns"] + b["duration_ns"]
        counted = recipe_ops(ops, overheads, b)
        mine = in_use_share(counted, lo, hi)
        diff = abs(mine - b["busy_share"])
        out["busy"].append({"device": b["device"], "start_ns": lo, "duration_ns": b["duration_ns"],
                            "moetune": round(mine, 4), "recipe": b["busy_share"], "diff": round(diff, 4),
                            "moetune_union": round(busy_share(counted, lo, hi), 4)})
        line = f"GPU {b['device']} busy: moetune {mine:.1%}, gpu_time_util {b['busy_share']:.1%}"
        if diff > BUSY_TOLERANCE and whole_graphs:  # the capture left the graphs out, not moetune
            out["notes"].append(f"{line}: {GRAPHS_WHOLE}")
        elif diff > BUSY_TOLERANCE:
            out["disagreements"].append(line)
    k = t.kernels.assign(pid=pid_of(t.kernels["globalPid"]))
    for n in recipes.get("nccl_overlap") or []:
        mine_ms, mine = comm_overlap_share(k[(k["deviceId"] == n["device"]) & (k["pid"] == n["pid"])])
        diff = abs(mine - n["overlap_share"])
        out["nccl_overlap"].append({"device": n["device"], "pid": n["pid"], "moetune_comm_ms": round(mine_ms, 4),
                                    "recipe_nccl_ms": round(n["nccl_ms"], 4), "moetune": round(mine, 4),
                                    "recipe": round(n["overlap_share"], 4), "diff": round(diff, 4)})
        if diff > OVERLAP_TOLERANCE:
            out["disagreements"].append(f"GPU {n['device']} NCCL time under compute: moetune {mine:.1%}, "
                                        f"nccl_gpu_overlap_trace {n['overlap_share']:.1%}")
    return out


def check_report(nsys: str, report: str | Path, sqlite: str | Path) -> dict:
    """Run RECIPES on one .nsys-rep into recipes_<report>/ beside it and compare moetune's figures
    of its SQLite with theirs; where this nsys has no `nsys recipe` (Debian's 2022.4), say so. A
    recipe that fails or finds no data of its kind is noted, not an error."""
    report = Path(report)
    out: dict = {"nsys": version(nsys)}
    if not has_recipes(nsys):
        out["skipped"] = ("this nsys has no `nsys recipe` (Nsight Systems 2023.x and later do): "
                          "moetune's figures are not checked against NVIDIA's recipes")
        return out
    folder = report.parent / f"recipes_{report.name.split('.')[0]}"
    out["ran"] = []
    for name in RECIPES:
        dest = folder / name
        shutil.rmtree(dest, ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([nsys, "recipe", name, "--input", str(report), "--output", str(dest)],
                           capture_output=True, text=True, timeout=3600)
        lines = (r.stdout + r.stderr).strip().splitlines()
        out["ran"].append({"recipe": name, "rc": r.returncode, "last_line": lines[-1][:200] if lines else ""})
    return {**out, **compare(sqlite, folder)}
