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


def test_the_summaries_stand_for_the_traces_only_when_each_rank_has_one_for_the_current_job(tmp_path, monkeypatch):
    """summary_gap names what keeps the per-rank summaries from standing for the exported traces:
    one missing, or one made for an earlier job; a gap that closes within the settling time is
    waited for, one that stays is said."""
    import types
    paths = TrialPaths(tmp_path)
    for r in (0, 1):
        paths.sqlite(r).write_text("")
    (tmp_path / "job.json").write_text(json.dumps({"job_id": "42", "kind": "slurm", "folder": "x", "name": "n"}))
    t = types.SimpleNamespace(paths=paths, folder=tmp_path)
    monkeypatch.setattr(traces, "load_ref", lambda t: types.SimpleNamespace(job_id="42"))
    assert traces.summary_gap(t) == "no trace_0.metrics.json, trace_1.metrics.json"
    paths.metrics(0).write_text(json.dumps({"for_job": "42", "ranks": []}, sort_keys=True))
    paths.metrics(1).write_text(json.dumps({"for_job": "41", "ranks": []}, sort_keys=True))
    assert traces.summary_gap(t) == "made for another job than 42: trace_1.metrics.json (job 41)"
    assert traces._settled_summaries(t, settle_s=0.2, poll_s=0.05) == (None, traces.summary_gap(t))
    paths.metrics(1).write_text(json.dumps({"for_job": "42", "ranks": []}, sort_keys=True))
    assert traces.summary_gap(t) is None
    assert traces._settled_summaries(t, settle_s=0.2) == ([paths.metrics(0), paths.metrics(1)], None)
    assert traces.summaries(t) == [paths.metrics(0), paths.metrics(1)]
