"""moetune/analysis/intervals.py: union, length, clip, gaps and intersection of [start, end) sets, against
hand-computed values and against a brute-force count over every nanosecond."""
import numpy as np
import pytest

from moetune.analysis import intervals as iv


def test_interval_union_and_intersection():
    """Union, length, intersection and gaps of a small set, against values worked by hand."""
    u = iv.union([0, 50, 200, 210], [100, 150, 300, 220])
    assert u[0].tolist() == [0, 200] and u[1].tolist() == [150, 300]
    assert iv.length(u) == 250
    other = iv.union([100, 250], [220, 400])
    assert iv.intersection_length(u, other) == 50 + 20 + 50
    gs, ge = iv.gaps(u, 0, 400)
    assert list(zip(gs.tolist(), ge.tolist())) == [(150, 200), (300, 400)]


def brute(starts, ends, lo=0, hi=1000):
    """Every covered nanosecond of [lo, hi), counted one by one."""
    cover = np.zeros(hi - lo, dtype=bool)
    for s, e in zip(starts, ends):
        cover[max(s, lo) - lo:max(min(e, hi), lo) - lo] = True
    return cover


@pytest.mark.parametrize("seed", range(20))
def test_union_intersection_gaps_and_clip_agree_with_counting_every_nanosecond(seed):
    """On random unsorted overlapping intervals: the union covers what they cover, its pieces are
    sorted and disjoint; the intersection, the gaps and the clip measure what counting gives."""
    rng = np.random.default_rng(seed)
    s1 = rng.integers(0, 900, 30); e1 = s1 + rng.integers(1, 100, 30)
    s2 = rng.integers(0, 900, 25); e2 = s2 + rng.integers(1, 100, 25)
    a, b = iv.union(s1, e1), iv.union(s2, e2)
    ca, cb = brute(s1, e1), brute(s2, e2)
    assert iv.length(a) == ca.sum() and (a[0][1:] > a[1][:-1]).all()
    assert iv.intersection_length(a, b) == (ca & cb).sum()
    gs, ge = iv.gaps(a, 100, 800)
    assert int((ge - gs).sum()) == (~ca[100:800]).sum()
    assert iv.length(iv.clip(a, 100, 800)) == ca[100:800].sum()


def test_empty_sets():
    """An empty set has no length, no overlap with anything, and one gap: the whole range."""
    empty = iv.union([], [])
    assert iv.length(empty) == 0
    assert iv.intersection_length(empty, iv.union([0], [10])) == 0
    gs, ge = iv.gaps(empty, 5, 9)
    assert gs.tolist() == [5] and ge.tolist() == [9]
