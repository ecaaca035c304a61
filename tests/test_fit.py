"""Fit first (spec/fit.py, the fit stage, the tuner): which ranks bound a layout's memory, the fit job
run for real with the CPU stand-in (no GPU here: the real path runs Megatron's fake process group on
the GPU machine, benchmarks/device/fit.sh), and a layout that does not fit never reaching the
cluster."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from moetune.pipeline.spec import fit
from moetune.pipeline.spec.config import TrainingConfig
from moetune.pipeline.store import Store
from moetune.pipeline.tune import loop as tuner
from moetune.pipeline.trial import stages

REPO = Path(__file__).resolve().parents[1]


def test_bounding_ranks_are_the_first_and_last_pipeline_stage():
    assert fit.bounding_ranks(TrainingConfig(tp=2, pp=1, ep=32), 256) == (0,)
    # tp-cp-ep-dp-pp order: a stage is 256/2 ranks, the last one starts at 128
    assert fit.bounding_ranks(TrainingConfig(tp=2, pp=2, ep=32), 256) == (0, 128)
    assert fit.bounding_ranks(TrainingConfig(tp=2, pp=16, ep=64), 1024) == (0, 960)


def test_fit_config_routes_statically_on_the_alltoall_dispatcher():
    c = fit.fit_config(TrainingConfig(ep=8, dispatcher="flex", flex_backend="deepep", train_iters=50))
    assert (c.dispatcher, c.flex_backend, c.capacity_factor, c.pad_to_capacity) == ("alltoall", None, 1.0, True)
    assert c.train_iters == fit.FIT_ITERS >= 3 and c.ep == 8
    args = c.to_args()
    assert "--moe-expert-capacity-factor" in args and "--moe-pad-expert-input-to-capacity" in args


@pytest.mark.parametrize("ranks, capacity, fits, words", [
    ({0: {"max_allocated_gb": 60.0, "max_reserved_gb": 62.0}}, 80.0, True, "rank 0 peaks at 62.0 GB"),
    ({0: {"max_allocated_gb": 60.0, "max_reserved_gb": 62.0},
      8: {"max_allocated_gb": 74.0, "max_reserved_gb": 75.0}}, 80.0, False, "rank 8 peaks at 75.0 GB"),
    ({0: {"max_allocated_gb": None, "failure": "oom"}}, 141.0, False, "rank 0 ran out of memory"),
    ({0: {"max_allocated_gb": None, "failure": None}}, 141.0, False, "rank 0 did not measure"),
])
def test_verdict_counts_the_headroom(ranks, capacity, fits, words):
    v = fit.verdict(ranks, capacity)
    assert v.fits is fits and words in v.reason
    assert v.headroom_gb == pytest.approx(fit.NCCL_BUFFERS_GB + fit.ROUTING_IMBALANCE_SHARE * capacity)


def stand_in_experiment(tmp_path, **cluster) -> str:
    exp = yaml.safe_load((REPO / "experiments" / "moe_proxy.yaml").read_text())
    exp["name"] = "fit_stand_in"
    exp["cluster"] = {"name": "cpu-1node", "template": "venv", "workload": "cpu_stand_in", "nodes": 1,
                      "gpus_per_node": 8, "ntasks_per_node": 1, "time_limit": "00:05:00", "nsys": "off",
                      "python": sys.executable, "gpu_type": "H100", "has_transformer_engine": False,
                      "stand_in": {"ms_per_iter": 20}, **cluster}
    exp["tuning"] = {"budget_trials": 2, "patience": 1, "fit_first": True}
    exp["baseline"] = dict(exp["baseline"], pp=2, ep=2, train_iters=10, profile_step_start=4,
                           profile_step_end=7)
    path = tmp_path / "fit_stand_in.yaml"
    path.write_text(yaml.safe_dump(exp))
    return str(path)


def test_a_layout_that_fits_is_measured_then_submitted(tmp_path):
    store = Store(str(tmp_path / "db.sqlite"))
    s = tuner.tune(stand_in_experiment(tmp_path), store, executor="local", runs_root=tmp_path / "runs",
                   progress=False)
    study = store.study(s["study"])
    base = store.trials(study.id)[0]
    assert [r.stage for r in store.stage_runs(base.id)][:2] == ["fit", "render"]
    folder = Path(base.folder)
    fitted = json.loads((folder / "fit" / "fit.json").read_text())
    assert fitted["fits"] and fitted["world"] == 8 and sorted(fitted["ranks"]) == ["0", "4"]
    # each rank ran alone, as the rank it stands for
    assert "[Rank 4]" in (folder / "fit" / "log_rank_4.txt").read_text()
    assert "[Rank 0]" in (folder / "fit" / "log_rank_0.txt").read_text()
    keep = next(d for d in store.decisions(study.id) if d.trial_id == base.id and d.kind == "keep")
    assert keep.evidence["fit"]["fits"] is True and "rank" in keep.evidence["fit"]["reason"]
    assert store.metrics(base.id)["fit_compute_ms"] == pytest.approx(20, rel=0.5)


def test_a_layout_that_does_not_fit_never_reaches_the_cluster(tmp_path):
    store = Store(str(tmp_path / "db.sqlite"))
    # 2 GB of GPU: the headroom alone (NCCL buffers, uneven routing) is more
    s = tuner.tune(stand_in_experiment(tmp_path, gpu_memory_gb=2), store, executor="local",
                   runs_root=tmp_path / "runs", progress=False)
    study = store.study(s["study"])
    base, = store.trials(study.id)
    assert base.state == "no_fit"
    assert [r.stage for r in store.stage_runs(base.id)] == ["fit"]  # never rendered nor submitted
    assert not (Path(stages.TrialContext(store, base.id, tmp_path / "runs").folder) / "job.sh").exists()
    revert = next(d for d in store.decisions(study.id) if d.trial_id == base.id)
    assert revert.kind == "revert" and "exceeds the GPU's 2 GB" in revert.reason
    assert revert.evidence["fit"]["fits"] is False
    assert "baseline trial did not complete (no_fit)" in s["stop_reason"]


def test_moetune_fit_by_hand(tmp_path, capsys):
    from moetune.pipeline.cli.main import main
    exp = stand_in_experiment(tmp_path)
    argv = ["--db", str(tmp_path / "db.sqlite"), "fit", exp, "--pp", "4", "--executor", "local",
            "--runs", str(tmp_path / "runs")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "on 8 GPUs: rank" in out and "fits the GPU's 80 GB" in out
    assert [ln.split()[0] for ln in out.splitlines()[2:]] == ["0", "6"]  # pp=4: the last stage starts at 6
    assert main(argv) == 0  # again: the same trial, measured anew
    store = Store(str(tmp_path / "db.sqlite"))
    assert len(store.trials(store.study("fit_stand_in-fit").id)) == 1


def test_the_report_shows_the_fit_and_the_compute_floor(tmp_path):
    from moetune.pipeline.report.study import study_markdown
    store = Store(str(tmp_path / "db.sqlite"))
    s = tuner.tune(stand_in_experiment(tmp_path), store, executor="local", runs_root=tmp_path / "runs",
                   progress=False)
    text = study_markdown(store, s["study"])
    assert "Fit on one GPU first: rank" in text and "fits the GPU" in text
    assert "ms is this rank's compute measured alone on one GPU" in text
