"""The tuner with submitit's local executor and real jobs: the CPU stand-in for training
(moetune/workloads/cpu_workload.py, no GPU here) runs each trial; every stage is the real one."""
import sys
from pathlib import Path

import pytest

from moetune.tune import loop as tuner
from moetune.tune.state import JUDGED
from moetune.store import Store
from tests.conftest import stand_in_experiment

pytestmark = pytest.mark.e2e  # whole tuning studies: make test runs them, make unit leaves them out

REPO = Path(__file__).resolve().parents[2]


def experiment(tmp_path, **tuning) -> str:
    return stand_in_experiment(tmp_path, "local_stand_in", {"python": sys.executable},
                               {"budget_trials": 3, "patience": 2, **tuning})


def test_local_executor_runs_the_baseline_for_real(tmp_path):
    """The local executor runs the stand-in baseline for real through render, submit, collect, export
    and analyze, at its known step time."""
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
    """Each fix tried on real local jobs is kept exactly when its gain beats the noise threshold and the
    rank test."""
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
    """The same study through sbatch on the local Slurm completes its baseline and stops at its budget
    of two trials."""
    # the same study through sbatch on the one-node Slurm of scripts/slurm-up
    store = Store(str(tmp_path / "db.sqlite"))
    s = tuner.tune(experiment(tmp_path, budget_trials=2), store, executor="slurm",
                   runs_root=tmp_path / "runs", progress=False)
    study = store.study(s["study"])
    trials = store.trials(study.id)
    assert trials[0].state == "completed" and trials[0].job_id.isdigit()
    assert s["trials"] == 2 and "budget" in s["stop_reason"]
    assert 20 < s["baseline_judged_step_time_ms"] < 200


# ---- a trial a stage cannot take through: recorded as stage_error, the study goes on and ends ----
def _study_ends_with_reports(store, tmp_path, name, stage, trial_number):
    """The trial's stage_error names its stage; the study has a stop decision and its reports."""
    from moetune.report import study as report
    study = store.study(name)
    trial = next(t for t in store.trials(study.id) if t.number == trial_number)
    assert trial.state == "stage_error"
    errors = [d for d in store.decisions(study.id) if d.kind == "stage_error" and d.trial_id == trial.id]
    assert len(errors) == 1 and errors[0].evidence["stage"] == stage
    assert errors[0].reason.startswith(f"{stage}: ")
    stops = [d for d in store.decisions(study.id) if d.kind == "stop"]
    assert len(stops) == 1 and study.state == "done"
    md, html = report.write_reports(store, name, tmp_path / "reports")
    assert "stage_error" in md.read_text() and html.exists()
    return errors[0], stops[0]


@pytest.mark.parametrize("stage", ["fit", "render", pytest.param("submit", marks=pytest.mark.slurm)])
def test_a_baseline_that_cannot_start_ends_the_study_with_its_reason_and_reports(tmp_path, stage, request,
                                                                                  monkeypatch):
    """Failures that only the trial's own job meets (the preflight before it renders and submits a
    one-node probe of the same cluster, and passes): the fit's and the trial's job script refuse,
    for real, a value holding a newline (render.py); the trial's job asks the real Slurm for 9
    nodes of its 3, which Slurm queues for ever (PartitionConfig): the watch cancels it and says
    why. The tuner records the stage_error, stops with its reason, and a second run of the tuner
    does not die on it."""
    from moetune.job import scheduler
    cluster = {"python": sys.executable}
    executor = "local"
    tuning = {"budget_trials": 3, "patience": 2}
    if stage in ("fit", "render"):  # the stand-in's flags go on the training command line
        cluster["stand_in"] = {"ms_per_iter": 30, "refuse": "--x\nrm -rf /"}
    if stage == "fit":  # the fit renders its own job first
        tuning["fit_first"] = True
        cluster["gpus_per_node"] = 8
    if stage == "submit":
        request.getfixturevalue("slurm")
        executor = "slurm"
        cluster["nodes"] = 9
        monkeypatch.setattr(scheduler, "NEVER_STARTS_AFTER_S", 2.0)
    exp = stand_in_experiment(tmp_path, "unstartable", cluster, tuning, **({"pp": 2} if stage == "fit" else {}))
    store = Store(str(tmp_path / "db.sqlite"))
    one_gpu = stage == "fit"  # the one-GPU study fits every trial first, the stand-in's workload too
    s = tuner.tune(exp, store, executor=executor, runs_root=tmp_path / "runs", progress=False, one_gpu=one_gpu)
    error, stop = _study_ends_with_reports(store, tmp_path, s["study"], stage, 1)
    assert "baseline trial did not complete" in stop.reason and error.reason in stop.reason
    assert ("will never start: Slurm keeps it pending (PartitionConfig)" if stage == "submit" else "newline") \
        in error.reason
    again = tuner.tune(exp, store, executor=executor, runs_root=tmp_path / "runs", progress=False, one_gpu=one_gpu)
    assert again["stop_reason"] == s["stop_reason"] and again["trials_total"] == s["trials_total"]


def _plant(tmp_path, study: str, trial_id: int, name: str, text: str) -> None:
    folder = tmp_path / "runs" / study / str(trial_id)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


@pytest.mark.parametrize("stage", ["collect", "export", "analyze"])
def test_a_change_whose_stage_fails_is_passed_over_and_the_study_goes_on(tmp_path, monkeypatch, stage, request):
    """Trial 2 (the first change) fails at one stage after its job ran: analyze and export for real
    (a trace that is not SQLite; an Nsight Systems report nsys cannot read), collect by an injected
    scheduler error (a stand-in: sacct failing cannot be made to happen on cue). The loop records
    stage_error and goes on to the next proposal; the study ends with a stop and its reports."""
    from moetune.job import scheduler
    study = "stage_fault"
    if stage == "analyze":
        _plant(tmp_path, study, 2, "trace_0.sqlite", "not a trace\n")
    if stage == "export":
        request.getfixturevalue("nsys_bin")  # the export runs `nsys export` on it
        _plant(tmp_path, study, 2, "trace_0.nsys-rep", "not a report\n")
    if stage == "collect":
        real_wait = scheduler.wait

        def injected_wait(ref, *a, **kw):  # stand-in for a scheduler that stops answering
            if ".t2." in ref.name:
                raise scheduler.JobError(f"injected: sacct did not answer for job {ref.job_id}")
            return real_wait(ref, *a, **kw)
        monkeypatch.setattr(scheduler, "wait", injected_wait)
    # the jobs run unprofiled (nsys off): the planted report is the only one the export finds
    exp = stand_in_experiment(tmp_path, study, {"python": sys.executable}, {"budget_trials": 4, "patience": 3})
    store = Store(str(tmp_path / "db.sqlite"))
    s = tuner.tune(exp, store, executor="local", runs_root=tmp_path / "runs", progress=False)
    _study_ends_with_reports(store, tmp_path, study, stage, 2)
    sid = store.study(study).id
    assert store.trials(sid)[0].state == "completed"
    after = [d.kind for d in store.decisions(sid)]
    after = after[after.index("stage_error") + 1:]
    # the loop went on: another change was applied, or it said why none was left
    assert "apply" in after or "no untried rule" in s["stop_reason"]
    again = tuner.tune(exp, store, executor="local", runs_root=tmp_path / "runs", progress=False)
    assert again["stop_reason"] == s["stop_reason"]
