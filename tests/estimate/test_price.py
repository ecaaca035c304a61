"""estimate.price, the one entry that prices a layout: the tuner's model (tune/predicted.Model)
and `moetune predict` read the same store (its calibration of the cluster, its fits) and give
the same figures for the same layout."""
from __future__ import annotations

import json

import pytest

from moetune.cli.main import main
from moetune.estimate import StoreReadings, price
from moetune.experiment.config import TrainingConfig
from moetune.experiment.schema import load_experiment
from moetune.store import Store
from moetune.tune import predicted

# a calibration of the experiment's cluster (qwen3_30b_a3b: h100-16, two nodes of 8 H100): links
# slower than the published rates and a GEMM sweep, so every calibrated rate moves
CALIBRATION = {"backend": "nccl", "device": "NVIDIA H100 80GB HBM3", "rows": [
    {"kind": "collective", "op": "all_to_all", "group": "node", "bytes": 64 << 20, "busbw_gb_s": 150.0,
     "ranks": 8, "nodes": 1, "us": 1.0},
    {"kind": "collective", "op": "all_to_all", "group": "across", "bytes": 64 << 20, "busbw_gb_s": 20.0,
     "ranks": 16, "nodes": 2, "us": 1.0},
    {"kind": "collective", "op": "all_reduce", "group": "across", "bytes": 64 << 20, "busbw_gb_s": 30.0,
     "ranks": 16, "nodes": 2, "us": 1.0},
    {"kind": "gemm", "op": "matmul", "tflop_s": 600.0, "us": 1.0, "n": 8192}]}
FIT_MS = 1300.0  # the fit's step of fit_micro_batches (2 a stage) of the baseline's layout


@pytest.fixture
def db(tmp_path, monkeypatch):
    """A SQLite store holding a calibration of qwen3_30b_a3b's cluster and a fit of its baseline."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MOETUNE_DB", raising=False)
    path = str(tmp_path / "store.sqlite")
    exp = load_experiment("qwen3_30b_a3b")
    store = Store(path)
    store.add_calibration(exp.cluster.name, exp.cluster.gpu_type, CALIBRATION, job_id="1")
    study = store.create_study("qwen3_30b_a3b-fit", exp.model.name, {"cluster": exp.cluster.model_dump()})
    t = store.add_trial(study.id, exp.baseline.to_dict(), exp.baseline.config_hash(), fix="fit")
    store.set_metrics(t.id, {"fit_compute_ms": FIT_MS})
    store.engine.dispose()
    return path


# the baseline (its compute the fit's) and another layout (analytic compute, calibrated links)
LAYOUTS = {"baseline": [], "ep8_tp2": ["--ep=8", "--tp=2"]}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_tuner_and_predict_price_a_layout_the_same(capsys, db, layout):
    """The tuner's model over the store the study writes and `moetune predict --db` over the same
    store: equal step and equal parts, for the fitted baseline and an unfitted layout alike."""
    exp = load_experiment("qwen3_30b_a3b")
    capsys.readouterr()
    assert main(["--db", db, "predict", "qwen3_30b_a3b", "--format", "json"] + LAYOUTS[layout]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert "calibration" in cli["inputs"]  # the store's calibration is read
    assert cli["compute_source"] == ("fit" if layout == "baseline" else "analytic")
    config = TrainingConfig.from_dict(cli["config"])
    tuner = predicted.Model(exp, Store(db)).terms(config)
    assert tuner is not None
    assert sum(tuner.values()) == pytest.approx(cli["step_time_ms"], abs=2e-3)
    for group, keys in predicted.TERM_GROUPS.items():
        assert tuner[group] == pytest.approx(sum(cli["terms"][k] for k in keys), abs=1e-2)


def test_price_is_the_cli_figure_and_names_what_it_read(db):
    """price() itself: the baseline's compute is the fit's per micro-batch times the step's
    micro-batches, its rates the calibration's; without a store, the published rates."""
    exp = load_experiment("qwen3_30b_a3b")
    p = price(exp, exp.baseline, StoreReadings(db))
    mb = p.inputs["micro_batches"]
    assert p.compute_source == "fit"
    assert p.terms["compute"] == pytest.approx(mb * FIT_MS / 2, rel=1e-9)
    assert "alltoall_nvlink" in p.inputs["rates_measured"]
    bare = price(exp, exp.baseline, StoreReadings.empty())
    assert bare.compute_source == "analytic" and "calibration" not in bare.inputs
    assert bare.step_time_ms != pytest.approx(p.step_time_ms, rel=1e-3)
    with pytest.raises(ValueError, match="no fit or one-GPU trial"):
        price(exp, exp.baseline, StoreReadings.empty(), compute="fit")
