"""Interval arithmetic on [start, end) arrays (ns), vectorised: union, length, intersection."""
from __future__ import annotations

import numpy as np


def union(starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """Merge overlapping intervals; returns sorted disjoint (starts, ends)."""
    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    if s.size == 0:
        return s, e
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


def length(u: tuple[np.ndarray, np.ndarray]) -> int:
    return int((u[1] - u[0]).sum())


def clip(u: tuple[np.ndarray, np.ndarray], lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    s = np.clip(u[0], lo, hi)
    e = np.clip(u[1], lo, hi)
    keep = e > s
    return s[keep], e[keep]


def intersection_length(a, b) -> int:
    """Length of the overlap of two disjoint, sorted interval sets."""
    if a[0].size == 0 or b[0].size == 0:
        return 0
    # events: +1 at starts, -1 at ends of each set; overlap where both counts are 1
    pts = np.concatenate([a[0], a[1], b[0], b[1]])
    da = np.concatenate([np.ones(a[0].size), -np.ones(a[1].size), np.zeros(b[0].size * 2)])
    db = np.concatenate([np.zeros(a[0].size * 2), np.ones(b[0].size), -np.ones(b[1].size)])
    order = np.argsort(pts, kind="stable")
    pts, da, db = pts[order], da[order], db[order]
    ca, cb = np.cumsum(da), np.cumsum(db)
    both = (ca > 0) & (cb > 0)
    seg = np.diff(pts)
    return int(seg[both[:-1]].sum())


def gaps(u: tuple[np.ndarray, np.ndarray], lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """The holes of a disjoint sorted set inside [lo, hi)."""
    s, e = clip(u, lo, hi)
    gs = np.concatenate([[lo], e])
    ge = np.concatenate([s, [hi]])
    keep = ge > gs
    return gs[keep], ge[keep]
