"""moetune's trace analysis: nsys SQLite → per-rank metrics → the dominant wall, with evidence.

Public API
    analyze(paths, log=None, gpu_memory_gb=None, workers=None) -> dict   # wall, confidence, evidence,
                                                            # metrics, log, warnings (what the capture
                                                            # leaves out: CUDA graphs traced whole);
                                                            # ranks in `workers` processes
    TraceError                                              # one-line message naming the file
    logs.parse_log(path) -> dict                            # Megatron log (plain or .xz)

`paths`: .sqlite, .sqlite.xz or .nsys-rep files, or folders of them; one file per rank or node, and
within a file one rank per (globalPid, deviceId). `wall` is memory | communication | host_overhead |
compute | unknown (walls.THRESHOLDS is the rule table). `metrics` = {"combined": {...},
"per_rank": {rank: {...}}}; metric names (shares are fractions of the profiled window):
    window_ms steps step_time_ms step_time_std_ms window_source
    gpu_busy_share gpu_idle_share sm_util_estimate comm_share exposed_comm_share
    exposed_a2a_share exposed_other_comm_share a2a_ms exposed_a2a_ms exposed_comm_ms (per step)
    kernels_per_step median_kernel_us launch_rate_per_ms cuda_graph_launches peak_memory_gb
    gemm_streams (streams that ran GEMMs: above 1 where TE's grouped GEMM spreads the experts)
    sm_active_share (only with GPU metrics sampling: mean "SMs Active" in the window, 0..1)
    gaps_over_{10,100,1000}us and gaps_over_{..}us_ms     idle-gap histogram: count, total ms
    launch_starved_ms sync_blocked_ms other_wait_ms        idle time by cause
    kernel_class_ms kernel_class_count                     {class: ms | count}, every class of
        kernels.CLASSES (gemm grouped_gemm attention moe_permute moe_router a2a nccl_other deepep
        hybridep te fp8_cast memcpy memset other), 0 when absent; stable names
combined only: ranks, max_gpu_idle_share, max_exposed_comm_share, a2a_transfer_ms (all-to-all
cost of the fastest rank), a2a_wait_ms / a2a_wait_share (the rest: waiting for a late peer),
exposed_comm_share_net / exposed_a2a_share_net (exposed communication, and exposed all-to-all, less
that waiting: what overlap could hide), and from the log
tflops_per_gpu / tokens_per_s.
"""
from __future__ import annotations

import re
from pathlib import Path

from moetune.analysis.errors import TraceError

TRACE_SUFFIXES = (".sqlite", ".sqlite.xz", ".nsys-rep")

__all__ = ["analyze", "TraceError", "trace_files"]


def _natural(path: Path) -> list:
    """trace_2 before trace_10."""
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", path.name)]


def trace_files(paths) -> list[Path]:
    """Expand directories into their trace files (one per rank or node); keep file order."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted((f for f in p.iterdir() if f.name.endswith(TRACE_SUFFIXES)), key=_natural)
            # prefer a .sqlite over the .nsys-rep / .xz it was made from
            stems = {f.name.split(".")[0] for f in found if f.name.endswith(".sqlite")}
            found = [f for f in found if f.name.endswith(".sqlite") or f.name.split(".")[0] not in stems]
            if not found:
                raise TraceError(f"{p}: no trace files (*.sqlite, *.nsys-rep) in this directory")
            out += found
        else:
            out.append(p)
    return out


def rank_frames(paths):
    """Yield (rank, kernels, copies, runtime, nvtx, memory, gpus) for every rank of every file."""
    for frames in _ranks(paths):
        yield frames[:7]


def _ranks(paths):
    """rank_frames, plus the rank's GPU's SM-activity samples (gpu_metrics) as an eighth item."""
    from moetune.analysis.gpu_metrics import for_device
    from moetune.analysis.kernels import classify
    from moetune.analysis.load import open_trace
    rank = 0
    for path in trace_files(paths):
        t = open_trace(path)
        k = t.kernels
        k = k.assign(cls=classify(k["name"]).astype(object)) if not k.empty else k.assign(cls=[])
        if k.empty:
            yield rank, k, t.copies, t.runtime, t.nvtx, t.memory, t.gpus, t.sm_active
            rank += 1
            continue
        # split every frame once by its rank key (process, and GPU where the frame has one)
        groups = {name: _split(df, ("globalPid", "deviceId"))
                  for name, df in (("k", k), ("copies", t.copies), ("memory", t.memory))}
        by_pid = {name: _split(df, ("globalPid",)) for name, df in (("rt", t.runtime), ("nvtx", t.nvtx))}
        for key in sorted(groups["k"]):
            pid = key[0]
            get = lambda g, kk, df: g.get(kk, df.iloc[0:0])
            yield (rank, groups["k"][key], get(groups["copies"], key, t.copies),
                   get(by_pid["rt"], (pid,), t.runtime), get(by_pid["nvtx"], (pid,), t.nvtx),
                   get(groups["memory"], key, t.memory), t.gpus, for_device(t.sm_active, key[1]))
            rank += 1


def _split(df, cols: tuple[str, ...]) -> dict:
    """{key tuple: the frame's rows with that key}, one pass over the frame."""
    if df.empty:
        return {}
    by = list(cols) if len(cols) > 1 else cols[0]
    out = {}
    for key, idx in df.groupby(by, sort=False).indices.items():
        out[key if isinstance(key, tuple) else (key,)] = df.iloc[idx]
    return {tuple(int(x) for x in k): v for k, v in out.items()}


def analyze(paths=(), log=None, gpu_memory_gb: float | None = None, workers: int | None = None) -> dict:
    """`workers`: processes that compute ranks' metrics at once (None: one per core; 1: in this
    process). Each rank is read and measured by itself (analysis.ranks); only small summaries come
    back, and the cross-rank all-to-all split is computed from them."""
    if not paths and not log:
        raise TraceError("nothing to analyze: give trace files and/or --log")
    parsed_log = None
    if log:
        from moetune.analysis.logs import parse_log
        parsed_log = parse_log(log)
    files = trace_files(paths)
    if not files:
        return log_only(parsed_log, gpu_memory_gb, str(log))
    from moetune.analysis import keys
    keys.start(files)  # the files' ranks are listed while pandas is imported (analysis.keys)
    from moetune.analysis.load import graphs_traced_whole_in
    from moetune.analysis.metrics import combine
    from moetune.analysis.ranks import map_ranks
    from moetune.analysis.skew import A2ASummaries
    per_rank: dict[int, dict] = {}
    with A2ASummaries() as a2a:  # kept on disk: memory does not grow with the ranks
        for s in map_ranks(files, workers):
            per_rank[s.rank] = s.metrics
            if s.a2a is not None:
                a2a.add(s.rank, s.a2a, s.window)
            if gpu_memory_gb is None and s.gpu_memory_gb is not None:
                gpu_memory_gb = s.gpu_memory_gb
        combined = combine(per_rank, a2a.wait_ns()) if per_rank else {}
    return result(combined, per_rank, parsed_log, gpu_memory_gb,
                  [str(p) for p in files] + ([str(log)] if log else []),
                  graph_warnings([p.name for p in files if graphs_traced_whole_in(p)]))


NO_TRACE = "no trace given: a wall is judged from a trace (moetune analyze TRACE... --log LOG)"


def log_only(parsed_log: dict, gpu_memory_gb: float | None, source: str) -> dict:
    """A log without a trace: what the log shows, its steady steps' median first (as a trial is
    judged), throughput, peak memory and how it ended. The wall only where the log names it (an
    out-of-memory failure); otherwise `unknown`, saying a trace is needed, not that a window was 0."""
    from moetune.analysis.logs import steady_iterations
    import numpy as np
    out = result({}, {}, parsed_log, gpu_memory_gb, [source])
    steady = steady_iterations(parsed_log)
    c = out["metrics"]["combined"]
    if steady:
        med = float(np.median(steady))
        c.update(steady_median_ms=round(med, 3), steady_steps=len(steady),
                 steady_mad_ms=round(float(np.median(np.abs(np.array(steady) - med))) * 1.4826, 3))
    out["evidence"] = [e for e in out["evidence"] if e.get("rule") != "no_window"]
    if out["wall"] == "unknown":
        out["evidence"].insert(0, {"rule": "no_trace", "wall": "unknown", "metric": None, "value": None,
                                   "threshold": None, "reason": NO_TRACE})
    out["log_only"] = True
    return out


def graph_warnings(names: list[str]) -> list[str]:
    """The warning for these trace files, whose CUDA graphs were traced as whole graphs: the kernel
    table misses the graphs' kernels, so the idle figures count the graphs' time as idle."""
    from moetune.analysis.load import GRAPHS_WHOLE
    return [f"{', '.join(names)}: {GRAPHS_WHOLE}. Until then gpu_idle_share is overstated, and "
            "gpu_busy_share and the kernel times understated, by the graphs' time"] if names else []


def result(combined: dict, per_rank: dict, parsed_log: dict | None, gpu_memory_gb: float | None,
           sources: list[str], warnings: list[str] | None = None) -> dict:
    """The analysis of combined and per-rank metrics: the log speaks where the trace is silent,
    then the wall (analyze() and analysis.summary.combine_summaries both end here). `warnings`:
    what the capture leaves out of the figures (the wall is decided on them all the same)."""
    from moetune.analysis.walls import classify as classify_wall
    if parsed_log:
        for key in ("step_time_ms", "step_time_std_ms", "tflops_per_gpu", "tokens_per_s"):
            if combined.get(key) is None and parsed_log.get(key) is not None:
                combined[key] = parsed_log[key]
        if parsed_log.get("max_allocated_gb") is not None:
            combined.setdefault("peak_memory_gb", parsed_log["max_allocated_gb"])
    verdict = classify_wall(combined, parsed_log, gpu_memory_gb)
    return {
        "wall": verdict["wall"],
        "confidence": verdict["confidence"],
        "evidence": verdict["evidence"],
        "metrics": {"combined": combined, "per_rank": per_rank},
        "log": parsed_log,
        "gpu_memory_gb": gpu_memory_gb,
        "sources": sources,
        "warnings": list(warnings or []),
    }
