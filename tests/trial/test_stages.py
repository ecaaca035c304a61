"""trial/stages.py on submitit's local executor (no Slurm, no nsys): records, skipping, force,
re-creation, the CLI's `moetune stage`, and a local job that outlives a killed tuner. (The study
lock: tests/tune/test_lock.py.)"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moetune.trial import stages
from tests.conftest import REPO, kill_tuner_after_submit, stand_in_cluster


def local_trial(make_trial, **kw):
    return make_trial(cluster=stand_in_cluster(nsys="off"), executor="local", **kw)


def test_all_stages_locally_then_skip_and_force(make_trial):
    """Every stage runs once through a real local job and records ok; run again the stages are
    skipped, forced they run again."""
    store, tid = local_trial(make_trial)
    out = stages.run_stages(store, tid, through="decide", poll_s=0.3, timeout_s=120)
    assert [r.stage for r in store.stage_runs(tid)] == list(stages.STAGE_ORDER)
    assert all(r.status == "ok" for r in store.stage_runs(tid))
    folder = Path(store.trial(tid).folder)
    state = json.loads((folder / "state.json").read_text())
    assert state["state"] == "COMPLETED" and state["outcome"] == "completed"
    analysis = json.loads((folder / "analysis.json").read_text())
    assert analysis["log"]["iterations"] == 8  # the stand-in printed every iteration line
    assert store.trial(tid).state == "completed"
    assert store.trial(tid).step_time_ms == pytest.approx(40, rel=0.5)
    decision = json.loads((folder / "decision.json").read_text())  # no tuner: no decisions yet
    assert decision["trial"] == store.trial(tid).number and decision["decisions"] == []
    assert out["export"] == []  # nsys off: no report to export

    runs = len(store.stage_runs(tid))
    for stage in stages.STAGE_ORDER[:-1]:
        stages.run_stage(store, tid, stage)  # every stage current: nothing runs
    assert len(store.stage_runs(tid)) == runs
    stages.run_stage(store, tid, "analyze", force=True)
    assert [r.stage for r in store.stage_runs(tid)][-1] == "analyze"
    assert len(store.stage_runs(tid)) == runs + 1


def test_analyze_recreated_identically_by_the_cli(make_trial, tmp_path):
    """`moetune stage analyze` writes back the same analysis.json byte for byte, says what it wrote,
    and --force runs it again."""
    store, tid = local_trial(make_trial)
    stages.run_stages(store, tid, through="analyze", poll_s=0.3, timeout_s=120)
    out = Path(store.trial(tid).folder) / "analysis.json"
    before = out.read_bytes()
    out.unlink()
    env = {**os.environ, "MOETUNE_DB": store.url}
    r = subprocess.run([sys.executable, "-m", "moetune.cli.main", "stage", "analyze", "--trial", str(tid)],
                       capture_output=True, text=True, env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"stage analyze of trial {tid} ran; it wrote 1 file:", f"  {out}"]
    assert out.read_bytes() == before
    n = len(store.stage_runs(tid, "analyze"))
    r = subprocess.run([sys.executable, "-m", "moetune.cli.main", "stage", "analyze", "--trial", str(tid),
                        "--force"], capture_output=True, text=True, env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert len(store.stage_runs(tid, "analyze")) == n + 1
    assert out.read_bytes() == before


def test_a_stage_before_its_inputs_is_one_clear_line(make_trial):
    """A stage run before its input exists names the missing file and the stage to run; an unknown
    stage is named."""
    store, tid = local_trial(make_trial)
    with pytest.raises(stages.StageError, match=r"job\.json is missing; run `moetune stage submit"):
        stages.run_stage(store, tid, "collect")
    with pytest.raises(stages.StageError, match="unknown stage"):
        stages.run_stage(store, tid, "bake")


def test_changed_config_rerenders(make_trial):
    """A trial whose config changed gets its job script rendered again with the new flag."""
    store, tid = local_trial(make_trial)
    first = stages.run_stage(store, tid, "render")
    job_sh = Path(first[0]).parent / "job.sh"
    text = job_sh.read_text()
    store.update_trial(tid, config={**store.trial(tid).config, "micro_batch": 4})
    stages.run_stage(store, tid, "render")
    assert len(store.stage_runs(tid, "render")) == 2
    assert "--micro-batch-size" in job_sh.read_text() and job_sh.read_text() != text


@pytest.mark.e2e
def test_local_job_outlives_a_killed_tuner_and_is_collected(make_trial):
    """A local job survives the tuner's SIGKILL after submit; resume finds the unfinished trial and
    collects the job's full log."""
    store, tid = make_trial(cluster=stand_in_cluster(nsys="off", stand_in={"ms_per_iter": 100,
                                                                          "busy": 0.1}),
                            executor="local", train_iters=30)
    kill_tuner_after_submit(store, tid, poll_s=0.3)
    study_id = store.trial(tid).study_id
    assert stages.unfinished(store, study_id) == [tid]
    stages.resume(store, study_id, poll_s=0.3, timeout_s=60)
    assert store.trial(tid).state == "completed"
    assert "iteration       30/      30" in (Path(store.trial(tid).folder) / "log.txt").read_text()


def test_the_cli_offers_the_stages_in_their_order():
    """`moetune stage` offers the fit and then every stage in its order, and no name the framework
    lacks."""
    from moetune.cli.main import STAGE_NAMES
    assert STAGE_NAMES == (stages.FIT,) + stages.STAGE_ORDER
    assert set(STAGE_NAMES) == set(stages.STAGES)
