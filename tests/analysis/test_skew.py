"""moetune/analysis/skew.py: the all-to-all wait split kernel by kernel (start skew of matching kernels, clipped
to the window; none for one rank; the same from summaries kept on disk), and EP libraries' kernels
classed by their namespace-qualified names."""
import pandas as pd
import pytest

from moetune.analysis.load import qualified_name
from moetune.analysis.skew import a2a_wait_ns
from moetune.analysis.window import Window


@pytest.mark.parametrize("short, demangled, cls", [
    ("dispatch", "void deep_ep::intranode::dispatch<(int)2, (int)768, (int)8192>(int4 *)", "deepep"),
    ("cached_notify_combine", "void deep_ep::intranode::cached_notify_combine<(int)2>(void **)", "deepep"),
    # HybridEP's JIT kernels live in namespace hybrid_ep (csrc/hybrid_ep/backend/hybrid_ep_backend.cuh)
    ("dispatch_kernel", "void hybrid_ep::dispatch_kernel<__nv_bfloat16, (int)8>(dispatch_kernel_param_t)",
     "hybridep"),
    ("combine_kernel", "void hybrid_ep::combine_kernel<(int)8>(combine_kernel_param_t)", "hybridep"),
])
def test_ep_library_kernels_are_classed_by_their_namespace(short, demangled, cls):
    """DeepEP/HybridEP kernels are classed by their demangled namespace; the bare short name alone says
    other."""
    from moetune.analysis.kernels import classify_name
    assert classify_name(short) == "other"  # the bare short name says nothing
    assert classify_name(qualified_name(short, demangled)) == cls


def _k(rows):
    return pd.DataFrame(rows, columns=["name", "start", "end"])


def test_wait_is_start_skew_of_matching_kernels_and_is_clipped_to_the_window():
    """A rank's a2a wait is how much earlier it starts each matching kernel than the last rank, counted
    only inside its window, with pairs matched over the whole capture."""
    # rank 0 starts each combine 300 ns before rank 1; dispatches start together
    r0 = _k([("dispatch", 0, 100), ("combine", 200, 600), ("dispatch", 1000, 1100), ("combine", 1200, 1600)])
    r1 = _k([("dispatch", 0, 100), ("combine", 500, 600), ("dispatch", 1000, 1100), ("combine", 1500, 1600)])
    whole = {0: Window(0, 2000, 2, (1000, 1000), "nvtx"), 1: Window(0, 2000, 2, (1000, 1000), "nvtx")}
    assert a2a_wait_ns({0: r0, 1: r1}, whole) == {0: 600.0, 1: 0.0}
    # rank 0's window starts at 1000: its first combine's wait is outside it, and the pairs still
    # match by order over the whole capture (not shifted by the window)
    late = {0: Window(1000, 2000, 1, (1000,), "nvtx"), 1: Window(0, 2000, 2, (1000, 1000), "nvtx")}
    assert a2a_wait_ns({0: r0, 1: r1}, late) == {0: 300.0, 1: 0.0}


def test_no_split_for_one_rank_or_unmatched_kernels():
    """One rank, or ranks whose a2a kernels do not match, give no wait split."""
    w = {0: Window(0, 10, 1, (10,), "nvtx"), 1: Window(0, 10, 1, (10,), "nvtx")}
    assert a2a_wait_ns({0: _k([("combine", 0, 5)])}, {0: w[0]}) is None
    assert a2a_wait_ns({0: _k([("combine", 0, 5)]), 1: _k([("dispatch", 0, 5)])}, w) is None


def test_summaries_kept_on_disk_give_the_same_split_and_are_removed():
    """Per-rank a2a summaries spilled to disk give the same wait split as in memory, and their folder is
    removed afterwards."""
    from moetune.analysis.skew import A2ASummaries, a2a_starts
    r0 = _k([("dispatch", 0, 100), ("combine", 200, 600), ("dispatch", 1000, 1100), ("combine", 1200, 1600)])
    r1 = _k([("dispatch", 0, 100), ("combine", 500, 600), ("dispatch", 1000, 1100), ("combine", 1500, 1600)])
    late = {0: Window(1000, 2000, 1, (1000,), "nvtx"), 1: Window(0, 2000, 2, (1000, 1000), "nvtx")}
    with A2ASummaries() as s:
        for rank, k in ((0, r0), (1, r1)):
            s.add(rank, a2a_starts(k), late[rank])
        folder = s._dir.name
        assert s.wait_ns() == a2a_wait_ns({0: r0, 1: r1}, late) == {0: 300.0, 1: 0.0}
    import os
    assert not os.path.exists(folder)
