"""job/scheduler.py: submitit's local executor and the GPUs a local trial sees (CUDA_VISIBLE_DEVICES).

Found on the GPU machine: without `gpus_per_node`, submitit sets the job's CUDA_VISIBLE_DEVICES to
nothing, and Megatron stopped with "Megatron requires CUDA". These jobs run for real through
submitit's local executor; their script only reports the variable, since no GPU is here."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from moetune.job import scheduler as jobs
from moetune.job import render


def _spec(tmp_path: Path, gpus: int) -> render.JobSpec:
    folder = tmp_path / f"job{gpus}"
    folder.mkdir()
    (folder / "job.sh").write_text('echo "visible=[${CUDA_VISIBLE_DEVICES-unset}]"\n')
    spec = render.job_spec(name="gpus", folder=folder, config={}, argv=[], launcher="local",
                           cluster={"template": "venv", "gpus_per_node": gpus, "nsys": "off",
                                    "time_limit": "00:02:00"})
    return dataclasses.replace(spec, gpus_per_node=gpus)


def _visible_in_job(tmp_path: Path, gpus: int) -> str:
    spec = _spec(tmp_path, gpus)
    ref = jobs.submit(spec, "local")
    assert jobs.wait(ref, poll_s=0.2, timeout_s=60).state == "COMPLETED"
    return Path(spec.log).read_text().strip()


def test_local_job_sees_as_many_gpus_as_the_cluster_gives_a_node(tmp_path, monkeypatch):
    """With no CUDA_VISIBLE_DEVICES set, a local job of 2 GPUs a node sees GPUs 0 and 1."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert _visible_in_job(tmp_path, 2) == "visible=[0,1]"


def test_local_job_keeps_to_the_gpus_this_process_was_given(tmp_path, monkeypatch):
    """A local job takes the first of the GPUs this process was given (3,5,6 gives 3,5), not GPUs 0
    and 1."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6")
    assert _visible_in_job(tmp_path, 2) == "visible=[3,5]"


def test_cpu_job_sees_no_gpu(tmp_path, monkeypatch):
    """A job of no GPUs sees none, whatever this process was given."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert _visible_in_job(tmp_path, 0) == "visible=[]"


@pytest.mark.parametrize("visible, needed, words", [
    ("GPU-8f2c1a", 1, "UUIDs"),
    ("0", 2, "needs 2 GPUs"),
])
def test_gpus_the_local_executor_cannot_give_are_one_clear_line(visible, needed, words):
    """GPUs this process was given by UUID, or fewer than the job asks for, are one line saying
    which."""
    with pytest.raises(jobs.JobError, match=words) as e:
        jobs.local_gpus(needed, visible)
    assert "\n" not in str(e.value)


def test_a_pending_reason_that_never_clears_is_named_with_what_to_change():
    """A pending job whose reason Slurm keeps until the job or the cluster changes (as squeue and
    sacct write it) gets the reason and the advice; a reason that clears by itself (Resources,
    Priority), a running job and no reason get None."""
    from moetune.job.scheduler import JobState, never_starts
    assert never_starts(JobState("PENDING", reason="(PartitionConfig)")).startswith(
        "Slurm keeps it pending (PartitionConfig): the request")
    assert "cluster.time_limit" in never_starts(JobState("PENDING", reason="PartitionTimeLimit"))
    assert never_starts(JobState("PENDING", reason="(Resources)")) is None
    assert never_starts(JobState("PENDING", reason="Priority")) is None
    assert never_starts(JobState("RUNNING", reason="PartitionConfig")) is None
    assert never_starts(JobState("PENDING")) is None


@pytest.mark.slurm
def test_a_job_slurm_never_starts_reads_pending_with_its_live_reason(slurm):
    """A 9-node job on the 3-node Slurm, read once accounting has its row: the state moetune reads
    is PENDING with the queue's live reason, PartitionConfig, and never_starts names it. (The
    queue's reason, not accounting's: sacct was seen to report a pending job's reason as None after
    the controller restarted, which left such a job waited on for ever.)"""
    import subprocess
    import time
    from moetune.job.scheduler import never_starts, slurm_state
    job = subprocess.run(["sbatch", "--parsable", "-N", "9", "--wrap", "true"], capture_output=True,
                         text=True, check=True).stdout.strip().split(";")[0]
    try:
        for _ in range(60):  # until accounting has its row, the case where its None hid the reason
            rows = subprocess.run(["sacct", "-n", "-P", "-X", "-j", job, "-o", "State"], capture_output=True,
                                  text=True).stdout.split()
            if rows:
                break
            time.sleep(0.5)
        st = slurm_state(job)
        assert (st.state, st.reason) == ("PENDING", "PartitionConfig")
        assert never_starts(st).startswith("Slurm keeps it pending (PartitionConfig)")
    finally:
        subprocess.run(["scancel", job], check=False)


def test_a_running_job_accounting_has_not_seen_yet_reads_its_node_from_the_queue(monkeypatch):
    """Before slurmdbd records a job, its state comes from squeue, whose %R is the node list once
    the job runs (a reason only while it waits)."""
    from moetune.job import scheduler, slurm
    monkeypatch.setattr(slurm.WATCHER, "rows", lambda job_id: [])
    monkeypatch.setattr(slurm, "queue", lambda job_id, array=False: [("RUNNING", "n2")])
    st = scheduler.slurm_state("77")
    assert (st.state, st.node, st.reason) == ("RUNNING", "n2", None)
    monkeypatch.setattr(slurm, "queue", lambda job_id, array=False: [("PENDING", "(Resources)")])
    st = scheduler.slurm_state("77")
    assert (st.state, st.node, st.reason) == ("PENDING", None, "Resources")


def test_a_local_controller_interrupted_writes_no_traceback_to_the_console(tmp_path, capfd):
    """Ctrl-C reaches submitit's local controller with the tuner: its KeyboardInterrupt traceback
    goes to the trial folder's local_controller.err, not between the tuner's lines on stderr; the
    job is still ended by it."""
    import os
    import signal
    import time

    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "job.sh").write_text("sleep 30\n")
    spec = render.job_spec(name="int", folder=folder, config={}, argv=[], launcher="local",
                           cluster={"template": "venv", "gpus_per_node": 0, "nsys": "off",
                                    "time_limit": "00:02:00"})
    ref = jobs.submit(spec, "local")
    time.sleep(3)  # the controller has started its task and waits on it
    os.kill(int(ref.job_id), signal.SIGINT)
    log = spec.paths.local_controller_log
    for _ in range(100):  # the controller ends its task, then prints its traceback and exits
        if "KeyboardInterrupt" in log.read_text():
            break
        time.sleep(0.2)
    assert "KeyboardInterrupt" in log.read_text()
    err = capfd.readouterr().err
    assert "KeyboardInterrupt" not in err and "Traceback" not in err
