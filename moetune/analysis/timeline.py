"""What a report draws of the profiled window, computed where the traces are (the analyze stage or
the per-rank summary job), so that the report itself never opens a trace.

    rank_view(rank, kernels, runtime, nvtx) -> dict | None   # one rank: its strip and kernel totals
    trace_views(paths) -> [dict]                              # every rank of these trace files
    timeline(views) -> dict                                   # the per-rank strips, as JSON
    top_kernels(views, n=10) -> [[name, class, ms per rank, count]]

A rank's strip is the window cut into `TIMELINE_COLUMNS` columns, each coloured by the kernel class
that ran longest in it; it is kept as runs of columns, [first, past the last, class], idle left out.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from moetune.analysis.metrics import in_window
from moetune.analysis.ranks import rank_frames
from moetune.analysis.window import Window, find_window

TIMELINE_COLUMNS = 600
IDLE = "idle"


def column_classes(k: pd.DataFrame, w: Window, cols: int = TIMELINE_COLUMNS) -> np.ndarray:
    """Per column of the window, the class of the kernels (clipped to it) that ran longest there."""
    edges = np.linspace(w.start, w.end, cols + 1)
    best = np.full(cols, IDLE, dtype=object)
    cover = np.zeros(cols)
    for cls, sel in k.groupby("cls"):
        s, e = sel["start"].to_numpy(), sel["end"].to_numpy()
        tot = np.zeros(cols)
        lo = np.clip(np.searchsorted(edges, s, "right") - 1, 0, cols - 1)
        hi = np.clip(np.searchsorted(edges, e, "left"), 1, cols)
        one = hi - lo <= 1  # most kernels sit inside one column
        np.add.at(tot, lo[one], (e - s)[one])
        for a, b, l0, h0 in zip(s[~one], e[~one], lo[~one], hi[~one], strict=True):
            for c in range(l0, h0):
                tot[c] += min(b, edges[c + 1]) - max(a, edges[c])
        more = tot > cover
        best[more], cover[more] = cls, tot[more]
    return best


def runs(best: np.ndarray) -> list[list]:
    """[first column, past the last, class] of each run of one class, idle runs left out."""
    out, start = [], 0
    for c in range(1, len(best) + 1):
        if c == len(best) or best[c] != best[start]:
            if best[start] != IDLE:
                out.append([start, c, str(best[start])])
            start = c
    return out


def kernel_totals(k: pd.DataFrame) -> dict:
    """The window's kernels per (name, class): total ms and count, as JSON columns."""
    if k.empty:
        return {"name": [], "cls": [], "ms": [], "n": []}
    k = k.assign(ms=(k["end"] - k["start"]) / 1e6)
    g = k.groupby(["name", "cls"]).agg(ms=("ms", "sum"), n=("ms", "size")).reset_index()
    return {"name": [str(x) for x in g["name"]], "cls": [str(x) for x in g["cls"]],
            "ms": [float(x) for x in g["ms"]], "n": [int(x) for x in g["n"]]}


def rank_view(rank, kernels: pd.DataFrame, runtime: pd.DataFrame, nvtx: pd.DataFrame,
              cols: int = TIMELINE_COLUMNS) -> dict | None:
    """One rank's window as a report draws it: bounds, steps, the classes that ran in it, the
    strip's runs and the kernel totals; None for a rank with no kernels or an empty window."""
    w = find_window(kernels, runtime, nvtx)
    if w.ns <= 0 or kernels.empty:
        return None
    k = in_window(kernels, w)
    return {"rank": rank.item() if hasattr(rank, "item") else rank, "start": int(w.start), "end": int(w.end),
            "steps": int(w.steps),
            "classes": sorted(str(c) for c in k["cls"].unique()),
            "runs": runs(column_classes(k, w, cols)), "kernels": kernel_totals(k)}


def trace_views(paths) -> list[dict]:
    """rank_view of every rank of these trace files (or folders), every row read."""
    out = []
    for rank, k, _c, rt, nvtx, _m, _g in rank_frames([str(p) for p in paths]):
        v = rank_view(rank, k, rt, nvtx)
        if v is not None:
            out.append(v)
    return out


def timeline(views: list[dict], cols: int = TIMELINE_COLUMNS) -> dict:
    """The per-rank strips of these views (their kernel totals left out)."""
    return {"columns": cols, "ranks": [{k: v for k, v in r.items() if k != "kernels"} for r in views]}


def top_kernels(views: list[dict], n: int = 10) -> list[list]:
    """[name, class, ms per rank, count] of the window's longest kernels over these ranks."""
    frames = [pd.DataFrame(v["kernels"]) for v in views]
    k = pd.concat(frames) if frames else pd.DataFrame()
    if k.empty:
        return []
    g = k.groupby(["name", "cls"]).agg(ms=("ms", "sum"), n=("n", "sum")).reset_index()
    g = g.sort_values("ms", ascending=False).head(n)
    return [[r.name, r.cls, round(r.ms / len(views), 3), int(r.n)] for r in g.itertuples()]
