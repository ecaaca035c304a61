"""moetune's figures beside NVIDIA's Nsight Systems recipes (`nsys recipe`, Nsight Systems 2023.x and
later), which performance engineers already trust: where both read one report, they must agree.

    read_recipes(folder)              -> what the recipes' outputs say (kernel time by name, GPU busy)
    kernel_ms_by_name(kernels)        -> moetune's kernel time by (short) name, from its kernel frame
    busy_share(kernels, lo, hi)       -> moetune's GPU busy share over [lo, hi): the union of kernels
    compare(trace, folder)            -> both side by side, and each disagreement as a line
    check_report(nsys, report, sqlite) -> the recipes run on a report (where this nsys has them)
                                          and compare() of its SQLite: what <report>.recipes.json holds

The recipes read (their output folders, named as the recipes are):
    cuda_gpu_kern_sum/all_stats.parquet   Name, Sum (ns): each kernel name's total time
    gpu_time_util/analysis.parquet        Start, Duration (ns), In-Use (%) per device: busy share

Where the two differ by design, compare() states the rule and applies it:
- names: moetune qualifies a kernel's name with its namespace (at::native::reduce_kernel), the
  recipe uses the short name (reduce_kernel): they are compared on the part after the last `::`;
- window: the recipes cover the whole report, moetune's metrics the profiled steps; the comparison
  takes the recipe's window (for gpu_time_util, [Start, Start + Duration)), over all kernels;
- busy: gpu_time_util's In-Use is a percentage with one decimal; the comparison allows its rounding
  within the tolerance.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd

from moetune.analysis import intervals as iv
from moetune.analysis.errors import TraceError
from moetune.analysis.nsys import has_recipes, version

RECIPES = ("cuda_gpu_kern_sum", "gpu_time_util", "nccl_gpu_overlap_trace")
KERNEL_TOLERANCE = 0.01  # relative, per kernel name
BUSY_TOLERANCE = 0.02  # absolute, as a share of the window


def short_name(name: str) -> str:
    return str(name).rsplit("::", 1)[-1]


def read_recipes(folder: str | Path) -> dict:
    """{"kernel_ms": {short name: ms}, "busy": [{"device", "start_ns", "duration_ns", "busy_share"}]};
    a recipe whose output is absent (no data of its kind in the report) is left out."""
    folder = Path(folder)
    out: dict = {}
    kern = folder / "cuda_gpu_kern_sum" / "all_stats.parquet"
    util = folder / "gpu_time_util" / "analysis.parquet"
    try:
        if kern.exists():
            df = pd.read_parquet(kern)
            names = df.index if "Name" not in df.columns else df["Name"]
            out["kernel_ms"] = {str(n): float(s) / 1e6 for n, s in zip(names, df["Sum"])}
        if util.exists():
            df = pd.read_parquet(util)
            out["busy"] = [{"device": int(r["Device ID"]), "start_ns": int(r["Start"]),
                            "duration_ns": int(r["Duration"]), "busy_share": float(r["In-Use"]) / 100}
                           for r in df.to_dict("records")]
    except (OSError, KeyError, ValueError) as e:
        raise TraceError(f"{folder}: not a recipe output this moetune reads ({e})") from None
    return out


def kernel_ms_by_name(kernels: pd.DataFrame) -> dict[str, float]:
    names = kernels["name"].astype(str).map(short_name)
    return {n: float(v) / 1e6 for n, v in (kernels["end"] - kernels["start"]).groupby(names).sum().items()}


def busy_share(kernels: pd.DataFrame, lo: int, hi: int) -> float:
    u = iv.clip(iv.union(kernels["start"].to_numpy(np.int64), kernels["end"].to_numpy(np.int64)), lo, hi)
    return iv.length(u) / (hi - lo) if hi > lo else 0.0


def compare(trace: str | Path, folder: str | Path) -> dict:
    """moetune's figures of one report beside its recipes' outputs in `folder`; `disagreements`
    lists each figure outside its tolerance (empty: they agree)."""
    from moetune.analysis import rank_frames  # the package's loader (imports this module's siblings)
    recipes = read_recipes(folder)
    kernels = pd.concat([k for _, k, *_ in rank_frames([str(trace)])], ignore_index=True)
    out: dict = {"kernels": [], "busy": [], "disagreements": []}
    ours = kernel_ms_by_name(kernels)
    for name, theirs in sorted((recipes.get("kernel_ms") or {}).items(), key=lambda kv: -kv[1]):
        mine = ours.get(name, 0.0)
        rel = abs(mine - theirs) / theirs if theirs else float(mine > 0)
        out["kernels"].append({"name": name, "moetune_ms": round(mine, 4), "recipe_ms": round(theirs, 4),
                               "rel_diff": round(rel, 5)})
        if rel > KERNEL_TOLERANCE:
            out["disagreements"].append(f"kernel {name}: moetune {mine:.3f} ms, cuda_gpu_kern_sum "
                                        f"{theirs:.3f} ms ({rel:.1%} apart)")
    for b in recipes.get("busy") or []:
        mine = busy_share(kernels[kernels["deviceId"] == b["device"]], b["start_ns"],
                          b["start_ns"] + b["duration_ns"])
        diff = abs(mine - b["busy_share"])
        out["busy"].append({"device": b["device"], "moetune": round(mine, 4), "recipe": b["busy_share"],
                            "diff": round(diff, 4)})
        if diff > BUSY_TOLERANCE:
            out["disagreements"].append(f"GPU {b['device']} busy: moetune {mine:.1%}, gpu_time_util "
                                        f"{b['busy_share']:.1%}")
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
