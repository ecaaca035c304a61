"""The tuner with submitit's local executor and real jobs: the CPU stand-in for training
(pipeline/cpu_workload.py, no GPU here) runs each trial; every stage is the real one."""
import sys
from pathlib import Path

import pytest

from moetune.pipeline.tune import loop as tuner
from moetune.pipeline.tune.state import JUDGED
from moetune.pipeline.store import Store
from tests.conftest import stand_in_experiment

REPO = Path(__file__).resolve().parents[1]


def experiment(tmp_path, **tuning) -> str:
    return stand_in_experiment(tmp_path, "local_stand_in", {"python": sys.executable},
                               {"budget_trials": 3, "patience": 2, **tuning})


def test_local_executor_runs_the_baseline_for_real(tmp_path):
    store = Store(str(tmp_path / "db.sqlite"))
    s = tuner.tune(experiment(tmp_path), store, executor="local", runs_root=tmp_path / "runs",
                   progress=False)
    study = store.study(s["study"])
    base = store.trials(study.id)[0]
    assert base.state == "completed" and s["trials"] >= 1
    # the stand-in printed Megatron iteration lines at about its 30 ms per iteration
    assert 20 < s["baseline_judged_step_time_ms"] < 200
    stages = [r.stage for r in store.stage_runs(base.id)]
    assert stages[:5] == ["render", "submit", "collect", "export", "analyze"]
    assert (Path(base.folder) / "log.txt").exists() and s["stop_reason"]


def test_local_changes_are_judged_against_their_noise(tmp_path):
    # real jobs on a shared machine: the judgment must follow gain vs noise, whichever it is
    store = Store(str(tmp_path / "db.sqlite"))
    s = tuner.tune(experiment(tmp_path), store, executor="local", runs_root=tmp_path / "runs",
                   progress=False)
    study = store.study(s["study"])
    changed = [t for t in store.trials(study.id) if t.fix and t.state == "completed"]
    assert changed, "a rule should have been tried"
    verdicts = {d.trial_id: d for d in store.decisions(study.id) if d.kind in JUDGED}
    for t in changed:
        d = verdicts[t.id]
        ev = d.evidence
        assert ev["judged_by"] == "log median" and 0 <= ev["p_faster"] <= 1
        assert (d.kind == "keep") == (ev["gain_ms"] > ev["least_gain_ms"] and ev["p_faster"] < 0.05)


@pytest.mark.slurm
def test_tuner_on_real_slurm(slurm, tmp_path):
    # the same study through sbatch on the one-node Slurm of scripts/slurm-up
    store = Store(str(tmp_path / "db.sqlite"))
    s = tuner.tune(experiment(tmp_path, budget_trials=2), store, executor="slurm",
                   runs_root=tmp_path / "runs", progress=False)
    study = store.study(s["study"])
    trials = store.trials(study.id)
    assert trials[0].state == "completed" and trials[0].slurm_job_id.isdigit()
    assert s["trials"] == 2 and "budget" in s["stop_reason"]
    assert 20 < s["baseline_judged_step_time_ms"] < 200
