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

from analysis.window import Window


def a2a_starts(k: pd.DataFrame) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A rank's summary for the split: {kernel name: (starts, ends)} in start order, 16 bytes a
    kernel; what a worker sends back instead of its kernel frame."""
    if k.empty:
        return {}
    order = np.argsort(k["start"].to_numpy(), kind="stable")
    names = k["name"].astype(str).to_numpy()[order]
    start, end = k["start"].to_numpy(np.int64)[order], k["end"].to_numpy(np.int64)[order]
    codes, uniques = pd.factorize(names)
    return {str(u): (start[codes == i], end[codes == i]) for i, u in enumerate(uniques)}


def a2a_wait_ns(a2a: dict[int, pd.DataFrame], windows: dict[int, Window]) -> dict[int, float] | None:
    """None with fewer than two ranks, or when no kernel is found on every rank."""
    return wait_from_starts({rank: a2a_starts(k) for rank, k in a2a.items()}, windows)


def wait_from_starts(starts: dict[int, dict], windows: dict[int, Window]) -> dict[int, float] | None:
    """a2a_wait_ns from each rank's a2a_starts: the i-th kernel of a name pairs across ranks while
    every rank has an i-th (min count); its latest start over the ranks ends each rank's wait."""
    if len(starts) < 2:
        return None
    common = set.intersection(*(set(s) for s in starts.values()))
    count = {n: min(len(s[n][0]) for s in starts.values()) for n in common}
    count = {n: c for n, c in count.items() if c}
    if not count:
        return None
    last = {n: np.max([s[n][0][:c] for s in starts.values()], axis=0) for n, c in count.items()}
    out = {}
    for rank, w in windows.items():
        total = 0.0
        for n, c in count.items():
            st, en = starts[rank][n][0][:c], starts[rank][n][1][:c]
            s = np.clip(st, w.start, None)
            e = np.clip(np.minimum(last[n], en), None, w.end)
            total += float(np.clip(e - s, 0, None).sum())
        out[rank] = total
    return out
