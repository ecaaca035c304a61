"""moetune/job/postprocess.py, the login side of the post-processing job: its sbatch line runs the
job's body (workloads/postprocess.py) by its path, one array element a rank, after the trial's job;
the array's state is COMPLETED only when every element is, and a missing element is waited for.
Slurm's commands are stand-ins here (the real ones: tests/integration/test_slurm_postprocess.py)."""
from __future__ import annotations

import os
import shlex

import pytest

from moetune.experiment.schema import cluster_section
from moetune.job import postprocess, slurm


def test_the_job_runs_the_body_by_its_path_one_element_a_rank(tmp_path):
    argv = postprocess.sbatch_argv(tmp_path, [0, 3], cluster_section({"name": "c", "partition": "cpu", "postprocess": {"mem": "2G"}}),
                                   after="77", name="t.post", python="/py/bin/python")
    assert argv[:2] == ["sbatch", "--parsable"]
    assert {"--dependency=afterany:77", "--array=0-1", "--mem=2G", "--partition=cpu"} <= set(argv)
    wrap = shlex.split(argv[argv.index("--wrap") + 1])
    assert wrap[:2] == ["/py/bin/python", str(postprocess.BODY)] and postprocess.BODY.exists()
    assert wrap[2:] == [str(tmp_path.resolve()), "--ranks", "0,3", "--task", "$SLURM_ARRAY_TASK_ID",
                        "--for-job", "77"]


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for cmd in ("sacct", "squeue"):
        (bin_ / cmd).write_text(f"#!/bin/sh\n[ -f {tmp_path}/{cmd}.txt ] && cat {tmp_path}/{cmd}.txt\nexit 0\n")
        (bin_ / cmd).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(slurm, "WATCHER", slurm.SacctWatcher(delay_s=0))
    return tmp_path


def sacct_rows(*pairs: tuple[str, str]) -> str:
    return "".join(f"{jid}|n|{st}|0:0|||||n1|None\n" for jid, st in pairs)


def test_the_array_completes_when_every_element_has(fake_slurm):
    (fake_slurm / "sacct.txt").write_text(sacct_rows(("5_0", "COMPLETED"), ("5_0.batch", "COMPLETED"),
                                                     ("5_1", "COMPLETED")))
    assert postprocess.state("5", 2) == "COMPLETED"
    (fake_slurm / "sacct.txt").write_text(sacct_rows(("5_0", "COMPLETED"), ("5_1", "TIMEOUT")))
    assert postprocess.state("5", 2) == "TIMEOUT"


def test_an_element_not_in_accounting_yet_is_waited_for(fake_slurm):
    """One of two elements in accounting: the queue's word, else UNKNOWN (still active)."""
    (fake_slurm / "sacct.txt").write_text(sacct_rows(("6_0", "COMPLETED")))
    (fake_slurm / "squeue.txt").write_text("RUNNING|n1\n")
    assert postprocess.state("6", 2) == "RUNNING"
    (fake_slurm / "squeue.txt").unlink()
    assert postprocess.state("6", 2) == "UNKNOWN"
    assert postprocess.wait("6", 2, timeout_s=0.3, poll_s=0.1) == "UNKNOWN"
