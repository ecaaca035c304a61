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

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from moetune.analysis.window import Window


def a2a_starts(k: pd.DataFrame) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A rank's summary for the split: {kernel name: (starts, ends)} in start order, 16 bytes a
    kernel; what a worker sends back instead of its kernel frame."""
    if k.empty:
        return {}
    order = np.argsort(k["start"].to_numpy(), kind="stable")
    start, end = k["start"].to_numpy(np.int64)[order], k["end"].to_numpy(np.int64)[order]
    name = k["name"]
    if isinstance(name.dtype, pd.CategoricalDtype) and not name.isna().any():  # by code: no strings a row
        codes, firsts = pd.factorize(name.cat.codes.to_numpy()[order])
        uniques = [str(name.cat.categories[c]) for c in firsts]
        if len(set(uniques)) == len(uniques):
            return {u: (start[codes == i], end[codes == i]) for i, u in enumerate(uniques)}
    codes, uniques = pd.factorize(name.astype(str).to_numpy()[order])
    return {str(u): (start[codes == i], end[codes == i]) for i, u in enumerate(uniques)}


def a2a_wait_ns(a2a: dict[int, pd.DataFrame], windows: dict[int, Window]) -> dict[int, float] | None:
    """None with fewer than two ranks, or when no kernel is found on every rank."""
    return wait_from_starts({rank: a2a_starts(k) for rank, k in a2a.items()}, windows)


def wait_from_starts(starts: dict[int, dict], windows: dict[int, Window]) -> dict[int, float] | None:
    """a2a_wait_ns from each rank's a2a_starts: the i-th kernel of a name pairs across ranks while
    every rank has an i-th (min count); its latest start over the ranks ends each rank's wait."""
    counts = {r: {n: len(v[0]) for n, v in s.items()} for r, s in starts.items()}
    return _wait(counts, starts.__getitem__, windows)


def _wait(counts: dict[int, dict], load, windows: dict[int, Window]) -> dict[int, float] | None:
    """The split from each rank's {name: count} and `load(rank)` -> its a2a_starts, read twice
    rank by rank (the latest starts, then each rank's wait): one rank's arrays at a time."""
    if len(counts) < 2:
        return None
    common = set.intersection(*(set(c) for c in counts.values()))
    count = {n: min(c[n] for c in counts.values()) for n in common}
    count = {n: c for n, c in count.items() if c}
    if not count:
        return None
    last = {n: np.full(c, np.iinfo(np.int64).min) for n, c in count.items()}
    for rank in counts:
        mine = load(rank)
        for n, c in count.items():
            np.maximum(last[n], mine[n][0][:c], out=last[n])
    out = {}
    for rank, w in windows.items():
        mine, total = load(rank), 0.0
        for n, c in count.items():
            st, en = mine[n][0][:c], mine[n][1][:c]
            s = np.clip(st, w.start, None)
            e = np.clip(np.minimum(last[n], en), None, w.end)
            total += float(np.clip(e - s, 0, None).sum())
        out[rank] = total
    return out


class A2ASummaries:
    """Ranks' a2a_starts kept in a temporary folder as they come from the workers, not in memory:
    at 16 bytes an all-to-all kernel they would grow with the number of ranks (62,500 such kernels
    a rank in benchmarks/analysis.py's trace set: 1 MB a rank). `with A2ASummaries() as s:`."""

    def __init__(self):
        self._dir: tempfile.TemporaryDirectory | None = None
        self.counts: dict[int, dict] = {}
        self.windows: dict[int, Window] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._dir is not None:
            self._dir.cleanup()
        return False

    def add(self, rank: int, starts: dict, window: Window) -> None:
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="moetune-a2a-")
        names = sorted(starts)
        arrays = {f"{kind}{i}": starts[n][j] for i, n in enumerate(names) for j, kind in enumerate("se")}
        np.savez(Path(self._dir.name) / f"{rank}.npz", **arrays)
        self.counts[rank] = {n: len(starts[n][0]) for n in names}
        self.windows[rank] = window

    def _load(self, rank: int) -> dict:
        with np.load(Path(self._dir.name) / f"{rank}.npz") as z:
            return {n: (z[f"s{i}"], z[f"e{i}"]) for i, n in enumerate(sorted(self.counts[rank]))}

    def wait_ns(self) -> dict[int, float] | None:
        """a2a_wait_ns of the ranks added."""
        return _wait(self.counts, self._load, self.windows)
