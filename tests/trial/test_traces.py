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


def test_an_analysis_recorded_again_keeps_the_tuners_figures(tmp_path):
    """record_analysis replaces only what an analysis writes: the tuner's judged step and GPU-hours
    stay, a figure the earlier analysis had and this one lacks goes, and the row's TFLOP/s/GPU is
    the log's where the trace has none, as the tuner records it."""
    from moetune.store import Store
    store = Store(str(tmp_path / "db.sqlite"))
    trial = store.add_trial(store.create_study("s", "m").id, {}, "h")
    earlier = {"metrics": {"combined": {"step_time_ms": 100.0, "gpu_idle_share": 0.3}}}
    store.set_metrics(trial.id, {"step_time_ms": 100.0, "gpu_idle_share": 0.3, "gpu_hours": 0.5,
                                 "judged_step_time_ms": 95.0})
    result = {"wall": "compute", "metrics": {"combined": {"step_time_ms": 101.0},
                                             "per_rank": {"0": {"step_time_ms": 102.0}}},
              "log": {"tflops_per_gpu": 58.9}}
    traces.record_analysis(store, trial.id, result, earlier)
    assert store.metrics(trial.id) == {"step_time_ms": 101.0, "gpu_hours": 0.5, "judged_step_time_ms": 95.0}
    assert store.metrics(trial.id, rank=0) == {"step_time_ms": 102.0}
    row = store.trial(trial.id)
    assert (row.wall, row.step_time_ms, row.tflops_per_gpu) == ("compute", 101.0, 58.9)
