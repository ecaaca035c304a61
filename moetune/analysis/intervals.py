"""Interval arithmetic on [start, end) arrays (ns), vectorised: union, length, intersection."""
from __future__ import annotations

import numpy as np


def union(starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """Merge overlapping intervals; returns sorted disjoint (starts, ends)."""
    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    if s.size == 0:
        return s, e
    if not is_sorted(s):  # kernels come in start order mostly: then no sort, no gather
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
    run_end = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    out_s = s[idx]
    out_e = np.maximum.reduceat(e, idx)
    return out_s, out_e


def is_sorted(a: np.ndarray) -> bool:
    return bool(a.size < 2 or (a[1:] >= a[:-1]).all())


def length(u: tuple[np.ndarray, np.ndarray]) -> int:
    return int((u[1] - u[0]).sum())


def clip(u: tuple[np.ndarray, np.ndarray], lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    s = np.clip(u[0], lo, hi)
    e = np.clip(u[1], lo, hi)
    keep = e > s
    return s[keep], e[keep]


def covered_before(u, t) -> np.ndarray:
    """Length of the disjoint sorted set `u` that lies before each time in `t` (int64, exact)."""
    us, ue = u
    t = np.asarray(t, dtype=np.int64)
    if us.size == 0:
        return np.zeros(t.size, dtype=np.int64)
    before = np.concatenate([[0], np.cumsum(ue - us)])
    i = np.searchsorted(us, t, side="right") - 1
    j = np.maximum(i, 0)
    part = np.clip(t - us[j], 0, ue[j] - us[j])
    return np.where(i >= 0, before[j] + part, 0)


def intersection_length(a, b) -> int:
    """Length of the overlap of two disjoint, sorted interval sets: what of `b` lies inside each
    interval of `a`, by binary search (no sort of the two sets together)."""
    if a[0].size == 0 or b[0].size == 0:
        return 0
    return int((covered_before(b, a[1]) - covered_before(b, a[0])).sum())


def gaps(u: tuple[np.ndarray, np.ndarray], lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """The holes of a disjoint sorted set inside [lo, hi)."""
    s, e = clip(u, lo, hi)
    gs = np.concatenate([[lo], e])
    ge = np.concatenate([s, [hi]])
    keep = ge > gs
    return gs[keep], ge[keep]
