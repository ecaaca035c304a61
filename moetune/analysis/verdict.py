"""The analysis's result: the ranks' metrics combined, the log's figures where the trace is silent,
and the wall decided on them (analyze() and analysis.summary.combine_summaries both end here).

    measure(files, log, gpu_memory_gb, workers) -> dict   # analyze() on its trace files
    log_only(parsed_log, gpu_memory_gb, source) -> dict   # a log without a trace
    result(combined, per_rank, parsed_log, gpu_memory_gb, sources, warnings) -> dict
"""
from __future__ import annotations

import numpy as np

from moetune.analysis import figures
from moetune.analysis.load import GRAPHS_WHOLE, graphs_traced_whole_in
from moetune.analysis.logs import parse_log, steady_iterations
from moetune.analysis.metrics import combine
from moetune.analysis.ranks import map_ranks
from moetune.analysis.skew import A2ASummaries
from moetune.analysis.walls import classify as classify_wall

NO_TRACE = "no trace given: a wall is judged from a trace (moetune analyze TRACE... --log LOG)"


def measure(files: list, log=None, gpu_memory_gb: float | None = None, workers: int | None = None) -> dict:
    """analyze() of these trace files (already expanded) and the log. Each rank is read and measured
    by itself (analysis.ranks); only small summaries come back, and the cross-rank all-to-all split
    is computed from them."""
    parsed_log = parse_log(log) if log else None
    if not files:
        return log_only(parsed_log, gpu_memory_gb, str(log))
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


def log_only(parsed_log: dict, gpu_memory_gb: float | None, source: str) -> dict:
    """A log without a trace: what the log shows, its steady steps' median first (as a trial is
    judged), throughput, peak memory and how it ended. The wall only where the log names it (an
    out-of-memory failure); otherwise `unknown`, saying a trace is needed, not that a window was 0."""
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
    return [f"{', '.join(names)}: {GRAPHS_WHOLE}. Until then gpu_idle_share is overstated, and "
            "gpu_busy_share and the kernel times understated, by the graphs' time"] if names else []


def result(combined: dict, per_rank: dict, parsed_log: dict | None, gpu_memory_gb: float | None,
           sources: list[str], warnings: list[str] | None = None) -> dict:
    """The analysis of combined and per-rank metrics: the log speaks where the trace is silent,
    then the wall. `warnings`: what the capture leaves out of the figures (the wall is decided on
    them all the same)."""
    if combined.get("peak_memory_gb") is not None:
        combined["peak_memory_source"] = "trace"
    if parsed_log:
        for key in ("step_time_ms", "step_time_std_ms"):
            if combined.get(key) is None and parsed_log.get(key) is not None:
                combined[key] = parsed_log[key]
        if parsed_log.get("max_allocated_gb") is not None and combined.get("peak_memory_gb") is None:
            combined.update(peak_memory_gb=parsed_log["max_allocated_gb"], peak_memory_source="log")
        # throughput at the step time judged on this very analysis (analysis/figures.py)
        judged = figures.judged_step({"log": parsed_log, "metrics": {"combined": combined}})
        combined.update({k: v for k, v in figures.throughput(parsed_log, judged["step_time_ms"]).items()
                         if v is not None})
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
