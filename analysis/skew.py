"""All-to-all skew: how much of each rank's all-to-all kernel time is waiting for a late peer.

A dispatch or combine kernel (NCCL SendRecv, DeepEP, HybridEP) cannot finish its exchange before
every peer has launched its own; until then it spins, and its time is not transfer. For the i-th
kernel of a name on every rank, a rank's wait runs from its kernel's start to the latest start of
that kernel among the ranks (at most to its own end); the rest is transfer. Kernels are matched by
name and order over the whole capture (each rank's window is cut at its own NVTX steps, so counting
inside the windows could shift the pairs), then each wait is clipped to its rank's window.
Ranks must share a clock: one report for all ranks, or reports of one node.

    a2a_wait_ns(kernels_by_rank, windows_by_rank) -> {rank: ns waited in its window} | None
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from moetune.analysis.window import Window


def a2a_wait_ns(a2a: dict[int, pd.DataFrame], windows: dict[int, Window]) -> dict[int, float] | None:
    """None with fewer than two ranks, or when no kernel is found on every rank."""
    if len(a2a) < 2:
        return None
    parts = []
    for rank, k in a2a.items():
        d = pd.DataFrame({"name": k["name"].astype(str).to_numpy(), "start": k["start"].to_numpy(),
                          "end": k["end"].to_numpy()}).sort_values("start", kind="stable")
        parts.append(d.assign(rank=rank, i=d.groupby("name").cumcount()))
    df = pd.concat(parts, ignore_index=True)
    on_all = df.groupby(["name", "i"])["rank"].transform("size") == len(a2a)
    df = df[on_all]
    if df.empty:
        return None
    last_start = df.groupby(["name", "i"])["start"].transform("max").to_numpy()
    wait_end = np.minimum(last_start, df["end"].to_numpy())
    out = {}
    for rank, w in windows.items():
        sel = (df["rank"] == rank).to_numpy()
        s = np.clip(df["start"].to_numpy()[sel], w.start, None)
        e = np.clip(wait_end[sel], None, w.end)
        out[rank] = float(np.clip(e - s, 0, None).sum())
    return out
