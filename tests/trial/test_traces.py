"""moetune/trial/traces.py: the analyze stage keeps what the report draws of the window beside the
analysis (timeline.json, top_kernels.json), and removes an earlier analysis's where it has none."""
import json
import sys
from pathlib import Path

from moetune.analysis import timeline
from moetune.job.paths import TrialPaths
from moetune.trial import traces

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import standin_bank  # noqa: E402


def test_views_are_written_then_removed_when_the_analysis_has_none(tmp_path):
    paths = TrialPaths(tmp_path)
    trace = standin_bank.write_trace(tmp_path / "trace_0.sqlite", "t", dict(standin_bank.BASE_STEP))
    views = traces._trace_views([str(trace)])
    assert [v["rank"] for v in views] == [0, 1]  # the stand-in trace holds two ranks
    written = traces.write_views(paths, views)
    assert written == [paths.timeline, paths.top_kernels]
    assert json.loads(paths.timeline.read_text()) == json.loads(json.dumps(timeline.timeline(views)))
    tops = json.loads(paths.top_kernels.read_text())
    assert tops == json.loads(json.dumps(timeline.top_kernels(views))) and len(tops) == 3
    assert "ncclDevKernel_SendRecv" in [t[0] for t in tops]
    assert traces.write_views(paths, None) == []
    assert not paths.timeline.exists() and not paths.top_kernels.exists()


def test_an_unreadable_trace_costs_only_the_views(tmp_path):
    bad = tmp_path / "trace_0.sqlite"
    bad.write_text("not a database")
    assert traces._trace_views([str(bad)]) is None
    assert traces._trace_views([]) is None
