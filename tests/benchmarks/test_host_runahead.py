"""benchmarks/host_runahead.py: the replay of a host's launches and waits against its kernels, on
hand-made sequences: the larger of host and GPU when the host can run ahead, the sum of what a
wait keeps apart when it cannot, and the ratio's scaling of the host."""
import sys

import pytest

from moetune.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import host_runahead as hr  # noqa: E402

# a host-heavy stretch (10 launches of 1 ns host, 0.1 ns GPU) then a GPU-heavy one (1 launch of
# 1 ns host, 10 ns GPU), twice
LIGHT = [(1.0, "launch", 0.1)] * 10
HEAVY = [(1.0, "launch", 10.0)]


def test_without_waits_the_host_runs_ahead():
    """Host 22 ns, GPU 22 ns: the first heavy kernel (11 to 21 ns) covers the next host-heavy
    stretch's launches, the second starts when the host issues it at 22 ns and ends at 32; never
    below the larger of the two totals."""
    ops = LIGHT + HEAVY + LIGHT + HEAVY
    t = hr.replay(ops, 1.0, waits=False)
    assert t == pytest.approx(32.0)
    assert t >= max(sum(o[0] for o in ops), sum(o[2] for o in ops))


def test_a_wait_empties_the_queue():
    """A wait after each heavy kernel holds the host until the GPU is done: the second stretch's
    launches cannot overlap the first heavy kernel, so the step is the two halves end to end."""
    ops = LIGHT + HEAVY + [(0.0, "wait", 0.0)] + LIGHT + HEAVY + [(0.0, "wait", 0.0)]
    assert hr.replay(ops, 1.0) == pytest.approx(2 * 21.0)
    assert hr.replay(ops, 1.0, waits=False) == pytest.approx(32.0)


def test_excess_scales_the_host_to_the_ratio():
    """excess(ops, r): the host scaled so that host / GPU = r; a host far slower than the GPU
    sets the step alone (excess 0 without waits), and the waits never make a step shorter."""
    ops = LIGHT + HEAVY + [(0.0, "wait", 0.0)] + LIGHT + HEAVY
    assert hr.excess(ops, 50.0, waits=False) == pytest.approx(0.0, abs=0.01)
    for r in (0.2, 0.5, 1.0, 2.0):
        assert hr.excess(ops, r) >= hr.excess(ops, r, waits=False) >= 0.0
