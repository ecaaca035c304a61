"""The EP 8 experiment (qwen3_30b_a3b_ep8) and its sweep are ready for an 8-GPU machine: each config passes moetune's
constraint table and Megatron 0.19.2's own validation for 8 GPUs of the TE image, and the baseline
fits 8 H200 by the calibrated estimate (the runs themselves need nvidia-h200-x8)."""
import importlib.util
from pathlib import Path

import pytest

from moetune.experiment import megatron_validate as mv
from moetune.experiment.constraints import check
from moetune.estimate.memory import baseline_layout

SPEC = importlib.util.spec_from_file_location(
    "ep8_sweep", Path(__file__).resolve().parents[2] / "benchmarks" / "device" / "ep8_sweep.py")
sweep = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(sweep)


def test_the_baseline_fits_eight_h200():
    """The sweep's 48-layer baseline fits eight H200 at EP 8."""
    layout = baseline_layout(sweep.EXP)
    assert layout.fits and layout.config.ep == 8 and sweep.EXP.model.num_layers == 48


@pytest.mark.parametrize("name, changes", sweep.SWEEP)
def test_each_sweep_config_passes_the_constraint_table(name, changes):
    """Each config of the EP 8 sweep passes moetune's constraint table."""
    assert check(sweep.config(changes), sweep.EXP.model, sweep.EXP.cluster) == [], name


@pytest.mark.megatron
@pytest.mark.skipif(not mv.available(), reason="no .venv-megatron (scripts/megatron-venv)")
def test_megatron_accepts_each_sweep_config():
    """Megatron's own validation accepts every config of the sweep."""
    names = [n for n, _ in sweep.SWEEP]
    argvs = [sweep.argv(sweep.config(c)) for _, c in sweep.SWEEP]
    refused = dict(zip(names, mv.validate(argvs, sweep.GPUS)))
    assert {n: r for n, r in refused.items() if r} == {}
