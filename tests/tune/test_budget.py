"""tune/budget.py: a trial is charged its whole job (and its fit), a replayed one what the bank
recorded; a stop names the budget it spent, read back from its evidence or its words."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from moetune.job import cost
from moetune.tune import budget


def test_the_budget_spent_names_itself():
    assert budget.spent_line(1, 0.0, 1, 1.0) == ("trials", "trial budget spent (1 of 1)")
    assert budget.spent_line(1, 2.0, 5, 1.5) == ("gpu_hours", "GPU-hour budget spent (2.00 of 1.5)")
    assert budget.spent_line(1, 0.5, 5, 1.5) is None


@pytest.mark.parametrize("reason, evidence, spent", [
    ("trial budget spent (1 of 1)", {"budget": "trials"}, "trials"),
    ("trial budget spent (1 of 1)", {}, "trials"),  # a stop recorded before stops named it
    ("GPU-hour budget spent (1.02 of 1.0)", {}, "gpu_hours"),
    ("no untried rule applies to trial 3 (wall host_overhead)", {}, None),
    ("no gain in the last 3 trials (patience 3)", {}, None),
])
def test_a_stop_names_the_budget_it_spent(reason, evidence, spent):
    assert budget.stopped_on(SimpleNamespace(reason=reason, evidence=evidence)) == spent


def test_a_replayed_trial_is_charged_its_recorded_job_else_its_iterations():
    """The demo's baseline took 74 s on 2 GPUs: 0.041 GPU-h, not its iterations' 0.019."""
    out = SimpleNamespace(fit=None)
    charged, basis = budget.trial_charge(None, out, 2, {"wall_s": 74, "gpus": 2}, [1000.0] * 34)
    assert charged["gpu_hours"] == pytest.approx(74 * 2 / 3600) and basis == budget.REPLAYED
    charged, basis = budget.trial_charge(None, out, 2, {"gpus": 2}, [1000.0] * 34)
    assert charged["gpu_hours"] == pytest.approx(34 * 2 / 3600) and basis == budget.REPLAYED_ITERATIONS


def test_a_trial_is_charged_its_slurm_job_and_its_fit(tmp_path):
    """Slurm's elapsed time x the trial's GPUs, plus its fit's job on one GPU; a trial that never
    ran a job is charged its fit alone."""
    (tmp_path / "job.json").write_text(json.dumps({"job_id": "5", "kind": "slurm", "folder": str(tmp_path),
                                                   "name": "t", "submitted_at": "2027-01-01T00:00:00+00:00"}))
    (tmp_path / "state.json").write_text(json.dumps({"state": "FAILED", "elapsed": "00:02:00",
                                                     "elapsed_s": 120.0}))
    out = SimpleNamespace(fit={"job": {"seconds": 36.0, "gpus": 1}})
    charged, basis = budget.trial_charge(tmp_path, out, 8, None, [10.0])
    assert basis == cost.SLURM and charged["job_seconds"] == 120.0
    assert charged["job_gpu_hours"] == pytest.approx(120 * 8 / 3600)
    assert charged["fit_gpu_hours"] == pytest.approx(0.01)
    assert charged["gpu_hours"] == pytest.approx(120 * 8 / 3600 + 0.01)
    charged, basis = budget.trial_charge(tmp_path / "none", out, 8)
    assert basis is None and charged["gpu_hours"] == pytest.approx(0.01)
