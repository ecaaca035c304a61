"""moetune/analysis/timeline.py: what a report draws of the profiled window, computed where the
traces are: each rank's strip (per column, the class that ran longest), the kernel totals and the
top kernels over ranks; and the per-rank summary carries the same views."""
import json
from pathlib import Path

import pandas as pd

from moetune.analysis import timeline
from moetune.analysis.summary import rank_summary, summary_views
from moetune.analysis.window import Window

ROOT = Path(__file__).resolve().parents[2]
TWO_RANKS = ROOT / "tests" / "data" / "gpu" / "recipes" / "moe_proxy_ep2_rank0" / "run.sqlite.xz"


def kernels(rows):
    return pd.DataFrame(rows, columns=["name", "cls", "start", "end"])


def test_each_column_takes_the_class_that_ran_longest_in_it():
    """Six columns of 100 ns: a GEMM fills the first two, an all-to-all the third, the fourth is
    idle, and in the fifth 60 ns of copy beat 40 ns of GEMM; a kernel across columns counts in each."""
    k = kernels([("g", "gemm", 0, 200), ("a", "a2a", 200, 300), ("c", "memcpy", 400, 460),
                 ("g", "gemm", 460, 500), ("g", "gemm", 500, 600)])
    best = timeline.column_classes(k, Window(0, 600, 1, (), "nvtx"), cols=6)
    assert list(best) == ["gemm", "gemm", "a2a", "idle", "memcpy", "gemm"]
    assert timeline.runs(best) == [[0, 2, "gemm"], [2, 3, "a2a"], [4, 5, "memcpy"], [5, 6, "gemm"]]


def test_top_kernels_are_per_rank_means_over_the_ranks():
    """Two ranks' totals: ms per rank is the sum over ranks divided by their number, counts add up,
    longest first, at most n."""
    one = {"kernels": timeline.kernel_totals(kernels([("g", "gemm", 0, 3_000_000), ("a", "a2a", 0, 1_000_000)]))}
    two = {"kernels": timeline.kernel_totals(kernels([("g", "gemm", 0, 1_000_000), ("g", "gemm", 0, 1_000_000),
                                                      ("m", "memcpy", 0, 500_000)]))}
    assert timeline.top_kernels([one, two]) == [["g", "gemm", 2.5, 3], ["a", "a2a", 0.5, 1],
                                                ["m", "memcpy", 0.25, 1]]
    assert timeline.top_kernels([one, two], n=1) == [["g", "gemm", 2.5, 3]]
    assert timeline.top_kernels([]) == []


def test_a_rank_without_kernels_has_no_view():
    empty = kernels([])
    assert timeline.rank_view(0, empty, pd.DataFrame(), pd.DataFrame(columns=["text", "start", "end"])) is None


def test_the_summary_carries_the_views_of_its_trace():
    """A post-processing job's summary holds what the report draws, the same as read from the trace
    on the login node; a summary written without them gives none."""
    views = json.loads(json.dumps(timeline.trace_views([TWO_RANKS])))
    assert views and all(v["runs"] and v["classes"] for v in views)
    s = json.loads(json.dumps(rank_summary(TWO_RANKS)))
    assert s["views"] == views
    assert summary_views([s, s]) == views + views
    assert summary_views([s, {k: v for k, v in s.items() if k != "views"}]) is None
    drawn = timeline.timeline(views)
    assert drawn["columns"] == timeline.TIMELINE_COLUMNS and "kernels" not in drawn["ranks"][0]
