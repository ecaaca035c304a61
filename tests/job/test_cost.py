"""job/cost.py: a job's whole time on its GPUs: Slurm's elapsed time where Slurm ran it, else its
wall time from submission to its end, every attempt of a trial summed."""
from __future__ import annotations

import json
import os
from datetime import datetime

import pytest

from moetune.job import cost
from moetune.job.paths import TrialPaths
from moetune.job.scheduler import JobState


@pytest.mark.parametrize("text, seconds", [("00:01:14", 74), ("1-02:03:04", 93784), ("03:04.5", 184.5),
                                           ("", None), (None, None), ("Unknown", None)])
def test_slurms_elapsed_time_in_seconds(text, seconds):
    assert cost.elapsed_seconds(text) == seconds


def test_slurm_counts_elapsed_raw_before_elapsed_before_wall_time():
    """ElapsedRaw (seconds) first, then Elapsed; submission to end only where Slurm has neither."""
    st = JobState(state="COMPLETED", elapsed="00:01:00", elapsed_s=74.0).to_dict()
    assert cost.job_seconds(st, 0, 1000) == (74.0, cost.SLURM)
    st = JobState(state="COMPLETED", elapsed="00:01:00").to_dict()
    assert cost.job_seconds(st, 0, 1000) == (60.0, cost.SLURM)
    st = JobState(state="COMPLETED").to_dict()
    assert cost.job_seconds(st, "2026-01-01T00:00:00+00:00", "2026-01-01T00:01:14+00:00") == (74.0, cost.WALL)
    assert cost.job_seconds(st, None, 5.0) == (None, cost.WALL)


def _attempt(folder, submitted: str, state: dict, ended: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.json").write_text(json.dumps({"job_id": "1", "kind": "local", "folder": str(folder / "submitit"),
                                                 "name": "t", "submitted_at": submitted}))
    (folder / "state.json").write_text(json.dumps(state))
    os.utime(folder / "state.json", (ended, ended))


def test_a_local_trial_costs_submission_to_end_every_attempt_summed(tmp_path):
    """A local job that hung (no result: its end is when it was collected) and its re-submit, which
    ended when submitit wrote its result: both attempts' wall times."""
    paths = TrialPaths(tmp_path / "t")
    submitted = "2027-01-15T08:00:00+00:00"
    t0 = datetime.fromisoformat(submitted).timestamp()
    _attempt(paths.previous("7"), submitted, {"state": "CANCELLED"}, t0 + 30)
    _attempt(paths.folder, submitted, {"state": "COMPLETED"}, t0 + 500)
    result = paths.folder / "submitit" / "1_0_result.pkl"
    result.parent.mkdir()
    result.write_bytes(b"")
    os.utime(result, (t0 + 40, t0 + 40))
    assert cost.trial_job_seconds(paths) == (70.0, cost.WALL)
    assert cost.gpu_hours(70.0, 2) == pytest.approx(140 / 3600)


def test_a_trial_never_collected_costs_nothing_known(tmp_path):
    assert cost.trial_job_seconds(TrialPaths(tmp_path)) == (None, cost.WALL)
    assert cost.gpu_hours(None, 8) == 0.0
