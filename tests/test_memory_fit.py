"""The memory estimate against the fit lease: rank 0 of ten production layouts measured on one
H200 (megatron-core 0.19.2 `--fake-process-group`, TE 2.20.2; benchmarks/fit_lease/, docs/memory.md).
The figures come from the committed logs, read by analysis/logs.py."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from moetune.analysis.logs import parse_log, read_log_text
from moetune.pipeline.spec.config import TrainingConfig
from moetune.pipeline.spec.experiment import load_experiment
from moetune.pipeline.spec.memory import ACTIVATION_SCALE, estimate, family

FIT = Path(__file__).resolve().parent.parent / "benchmarks" / "fit_lease"
LAYOUTS = [l for l in json.loads((FIT / "layouts.json").read_text()) if l["rank"] == 0]
STATE = re.compile(r"\(after 2 iterations\) memory \(MB\) \| allocated: ([\d.]+)")


def _measured(name):
    log = FIT / "logs" / f"{name}.log.xz"
    state_mb = float(STATE.search(read_log_text(log)).group(1))  # after the step: weights, grads, optimizer
    return parse_log(log)["max_allocated_gb"], state_mb / 1024


def test_ten_layouts_five_models():
    assert len(LAYOUTS) == 10 and len({l["model"] for l in LAYOUTS}) == 5


@pytest.mark.parametrize("lay", LAYOUTS, ids=lambda l: l["name"])
def test_estimate_within_10_percent_of_measured_peak(lay):
    exp = load_experiment(lay["model"])
    est = estimate(exp.model, TrainingConfig.from_dict(lay["config"]), lay["world_size"])
    peak, state = _measured(lay["name"])
    assert est.model_state_gb + est.activations_gb == pytest.approx(peak, rel=0.10)
    assert est.model_state_gb == pytest.approx(state, rel=0.10)  # the model state alone, too


def test_measured_terms_are_per_family_not_per_layout():
    models = {l["model"] for l in LAYOUTS}
    assert set(ACTIVATION_SCALE) == {family(load_experiment(m).model) for m in models}
    assert len(ACTIVATION_SCALE) == 3 and all(0.7 < v <= 1.0 for v in ACTIVATION_SCALE.values())
