"""A study of 3 trials end to end through the real one-node Slurm: each job runs the CPU
stand-in for training under real `nsys profile`; the report is exported to SQLite and analyzed,
and the store shows every stage. Also: a rendered script with hostile names runs safely."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
import sys
from pathlib import Path

import pytest

from moetune.analysis.nsys import has_recipes, version
from moetune.analysis.recipes import RECIPES
from moetune.job import scheduler as jobs
from moetune.trial import stages
from tests.conftest import REPO, stand_in_cluster

pytestmark = [pytest.mark.slurm, pytest.mark.nsys]



def test_three_trial_study_through_slurm_under_nsys(slurm, nsys_bin, make_trial):
    """Three trials run side by side through Slurm under nsys: every stage ok, rank 0 traced with all
    its NVTX iterations, analysed, and the recipes run where nsys has them."""
    ids = []
    for mb in (1, 2, 4):
        store, tid = make_trial(micro_batch=mb, study="study3")
        ids.append(tid)
    for tid in ids:  # submit all three, then collect: they run side by side
        stages.run_stage(store, tid, "render")
        stages.run_stage(store, tid, "submit")
    for tid in ids:
        stages.run_stages(store, tid, through="decide", poll_s=1, timeout_s=300)
    job_ids = set()
    for tid in ids:
        tr = store.trial(tid)
        assert tr.state == "completed"
        assert [r.stage for r in store.stage_runs(tid)] == list(stages.STAGE_ORDER)
        assert all(r.status == "ok" for r in store.stage_runs(tid))
        folder = Path(tr.folder)
        assert jobs.slurm_state(tr.job_id).state == "COMPLETED"  # Slurm's own word
        job_ids.add(tr.job_id)
        assert (folder / "trace_0.nsys-rep").exists() and not (folder / "trace_1.nsys-rep").exists()
        with sqlite3.connect(folder / "trace_0.sqlite") as db:
            texts = [r[0] for r in db.execute("SELECT text FROM NVTX_EVENTS WHERE text LIKE 'iteration %'")]
        assert len(texts) == 8  # every stand-in iteration is an NVTX range in the trace
        analysis = json.loads((folder / "analysis.json").read_text())
        assert analysis["metrics"]["per_rank"]["0"]["steps"] == 8
        assert store.metrics(tid)["step_time_ms"] == pytest.approx(40, rel=0.5)
        note = json.loads((folder / "trace_0.recipes.json").read_text())
        assert note["nsys"] == version(nsys_bin)  # the job's nsys is the installed one
        if has_recipes(nsys_bin):  # Nsight Systems 2023.x and later: the recipes ran in the job
            assert [r["recipe"] for r in note["ran"]] == list(RECIPES) and "skipped" not in note
        else:  # Debian's 2022.4: the note says why they did not
            assert note["skipped"].startswith("this nsys has no `nsys recipe`") and "ran" not in note
        assert analysis["recipes"]["trace_0"] == note  # the analysis carries it to the report
        decision = json.loads((folder / "decision.json").read_text())  # no tuner: no decisions
        assert decision["trial"] == tr.number and decision["decisions"] == []
        assert "--micro-batch-size" in (folder / "command.txt").read_text()
    assert len(job_ids) == 3


def test_hostile_names_and_paths_run_safely(slurm, make_trial, tmp_path):
    """Study, folder, venv and environment values full of shell syntax run the trial and its sbatch
    script safely: nothing they name is executed."""
    evil = "a b $(touch pwned) `touch pwned` 'q\" ;x %j"
    venv = tmp_path / f"venv {evil}"
    venv.symlink_to(Path(sys.prefix))  # the venv running the tests, under a hostile name

    def pwned() -> list[Path]:
        places = [tmp_path, REPO, Path.cwd(), Path("/tmp"), Path.home()]
        return [p / "pwned" for p in places if (p / "pwned").exists()] + \
            [p for p in tmp_path.rglob("pwned")]

    cluster = stand_in_cluster(nsys="off", venv=str(venv), env={"MOETUNE_PROBE": evil})
    store, tid = make_trial(cluster=cluster, study=f"model {evil}",
                            runs_root=tmp_path / f"runs {evil}")
    out = stages.run_stages(store, tid, through="collect", poll_s=1, timeout_s=180)
    folder = Path(store.trial(tid).folder)
    assert evil in str(folder)
    assert json.loads((folder / "state.json").read_text())["state"] == "COMPLETED"
    assert "iteration        8/       8" in (folder / "log.txt").read_text()
    assert not pwned()
    # the same script through plain sbatch, as an engineer would submit it
    r = subprocess.run(["sbatch", "--parsable", "--wait", str(folder / "job.sbatch")], cwd=folder,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip().split(";")[0]
    state = jobs.slurm_state(job)
    for _ in range(40):  # sbatch --wait returns as the job ends; the accounting says so a moment later
        if state.terminal:
            break
        time.sleep(0.5)
        state = jobs.slurm_state(job)
    assert state.state == "COMPLETED"
    assert not pwned()
    assert out["collect"]
