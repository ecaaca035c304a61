"""analyze() split in two, so the heavy half can run where the trace is (a CPU job on the cluster)
and the login node only combines small files.

    rank_summary(path) -> dict            # one trace file: its ranks' metrics + what skew needs
    combine_summaries(summaries, log=None, gpu_memory_gb=None) -> dict   # == analyze(paths, log)
    load_summary(path) -> dict            # a written summary, its kernel lists as arrays
    summary_views(summaries) -> [dict] | None   # what a report draws (analysis.timeline), if all have it

A summary is plain JSON: per rank of the file (in analyze's order) its rank_metrics, its window,
its all-to-all kernels inside the capture (name, start, end: the cross-rank wait split in skew.py
matches kernels by name and order, so it needs every rank's starts), its GPU-sampled SM activity,
and the GPU's memory; per file, whether its CUDA graphs were traced as whole graphs (the analysis's
warning), and its ranks' views (analysis.timeline.rank_view: the report's timeline and top kernels,
absent from a summary written before they were kept). The functions are pure: same inputs, same
output, no files written.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from moetune.analysis.errors import TraceError
from moetune.analysis.load import graphs_traced_whole_in
from moetune.analysis.logs import parse_log
from moetune.analysis.metrics import combine
from moetune.analysis.ranks import RankSummary, map_ranks, rank_labels
from moetune.analysis.skew import a2a_wait_ns
from moetune.analysis.timeline import trace_views
from moetune.analysis.verdict import graph_warnings, result
from moetune.analysis.window import Window

SUMMARY_VERSION = 2
SUFFIX = ".metrics.json"  # trace_R.sqlite -> trace_R.metrics.json, beside the report


def summary_path(trace: str | Path) -> Path:
    """Where a report's per-rank summary goes: beside it, named by its stem."""
    p = Path(trace)
    return p.with_name(p.name.split(".")[0] + SUFFIX)


def rank_summary(path: str | Path) -> dict:
    """Everything analyze() takes from one trace file, small enough to ship back as JSON: its ranks
    measured as analyze() measures them (analysis.ranks, in this process)."""
    ranks = list(map_ranks([path], workers=1))
    return {"version": SUMMARY_VERSION, "source": str(path), "ranks": [summary_entry(s) for s in ranks],
            "gpu_memory_gb": next((s.gpu_memory_gb for s in ranks if s.gpu_memory_gb is not None), None),
            "graphs_traced_whole": graphs_traced_whole_in(path),
            # a second read of the file, every row: the job has the time, the login node has not
            "views": trace_views([path])}


def summary_views(summaries: list[dict]) -> list[dict] | None:
    """The ranks' views of these summaries in their order; None where one was written without them."""
    if not summaries or any(s.get("views") is None for s in summaries):
        return None
    return [v for s in summaries for v in s["views"]]


def summary_entry(s: RankSummary) -> dict:
    """A rank's summary as JSON: its metrics, its window, and its all-to-all kernels (a few distinct
    names, many kernels: each name once, and its index per kernel)."""
    w = s.window
    entry = {"metrics": s.metrics,
             "window": {"start": int(w.start), "end": int(w.end), "steps": int(w.steps),
                        "step_times_ns": [int(x) for x in w.step_times_ns], "source": w.source},
             "a2a": None}
    if s.a2a is not None:
        a2a = s.a2a
        names = sorted(a2a)

        def column(j: int) -> list:
            return np.concatenate([a2a[n][j] for n in names] or [[]]).astype(np.int64).tolist()

        counts = [len(s.a2a[n][0]) for n in names]
        entry["a2a"] = {"names": names, "name": np.repeat(np.arange(len(names)), counts).tolist(),
                        "start": column(0), "end": column(1)}
    return entry


def compact(a2a: dict) -> dict:
    """A summary's all-to-all lists as int64 arrays (8 bytes a kernel, not a Python int's 36)."""
    return {"names": a2a["names"], **{k: np.asarray(a2a[k], dtype=np.int64) for k in ("name", "start", "end")}}


def load_summary(path: str | Path) -> dict:
    """Read one trace_R.metrics.json, its all-to-all lists turned into arrays at once, so that
    reading a study's many summaries holds one file's lists at a time."""
    s = json.loads(Path(path).read_text())
    for entry in s.get("ranks") or []:
        if entry.get("a2a") is not None:
            entry["a2a"] = compact(entry["a2a"])
    return s


def combine_summaries(summaries: list[dict], log=None, gpu_memory_gb: float | None = None) -> dict:
    """analyze()'s result from the files' summaries (in the files' order) and the log."""
    if not summaries and not log:
        raise TraceError("nothing to analyze: give trace files and/or --log")
    parsed_log = parse_log(log) if log else None
    per_rank: dict[int, dict] = {}
    a2a_kernels, windows = {}, {}
    for s in summaries:
        if s.get("version") != SUMMARY_VERSION:
            raise TraceError(f"{s.get('source')}: summary version {s.get('version')!r}, expected "
                             f"{SUMMARY_VERSION}; run the export/analyze job again")
    labels = iter(rank_labels([(s.get("source") or "", s["ranks"]) for s in summaries]))  # as analyze()
    for s in summaries:
        for entry in s["ranks"]:
            rank = next(labels)
            per_rank[rank] = dict(entry["metrics"])
            if entry["a2a"] is not None:
                w = entry["window"]
                windows[rank] = Window(w["start"], w["end"], w["steps"], tuple(w["step_times_ns"]), w["source"])
                a = compact(entry["a2a"])
                names = np.asarray(a["names"], dtype=object)
                a2a_kernels[rank] = pd.DataFrame({"name": names[a["name"]] if len(names) else
                                                  np.asarray([], dtype=object),
                                                  "start": a["start"], "end": a["end"]})
        if gpu_memory_gb is None and s.get("gpu_memory_gb") is not None:
            gpu_memory_gb = s["gpu_memory_gb"]
    combined = combine(per_rank, a2a_wait_ns(a2a_kernels, windows)) if per_rank else {}
    # a summary written before graphs_traced_whole was kept says nothing of its graphs: no warning
    whole = [Path(s["source"]).name for s in summaries if s.get("graphs_traced_whole")]
    return result(combined, per_rank, parsed_log, gpu_memory_gb,
                  [s["source"] for s in summaries] + ([str(log)] if log else []), graph_warnings(whole))
