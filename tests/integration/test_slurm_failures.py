"""Failure modes against the real Slurm of scripts/slurm-up (3 nodes), each leaving the store
consistent and the study resumable: OUT_OF_MEMORY, CANCELLED (not retried), slurmctld restarted
while a job runs, the tuner SIGKILLed between submit and collect, TIMEOUT (of a one-node and of a
2-node trial), NODE_FAIL. The TIMEOUT jobs (a minute, Slurm's least) are submitted first and run
beside the others; NODE_FAIL runs last, its job's node set down. (A node dying under a 2-node
trial of a tuning study: tests/integration/test_slurm_node_failure.py.)"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moetune.job import scheduler as jobs
from moetune.trial import run, stages
from tests.conftest import kill_tuner_after_submit, stand_in_cluster

pytestmark = pytest.mark.slurm
LONG = {"ms_per_iter": 100, "busy": 0.05}  # a long, mostly idle stand-in: 100 ms an iteration


def long_cluster(**kw):
    return stand_in_cluster(nsys="off", stand_in=LONG, **kw)


def wait_running(job_id: str, timeout_s: float = 60) -> None:
    t0 = time.monotonic()
    while jobs.slurm_state(job_id).state != "RUNNING":
        assert time.monotonic() - t0 < timeout_s, f"job {job_id} never started"
        time.sleep(0.5)


def submitted(store, tid) -> str:
    stages.run_stage(store, tid, "render")
    stages.run_stage(store, tid, "submit")
    return store.trial(tid).job_id


def jobs_named(name: str, wait_s: float = 30) -> list[str]:
    """Job ids with this name in Slurm's accounting. slurmdbd records jobs asynchronously, so an
    empty answer is asked again for up to `wait_s` (seen in CI: empty right after a cancel)."""
    deadline = time.monotonic() + wait_s
    while True:
        out = subprocess.run(["sacct", "-X", "-n", "-P", "--name", name, "-S", "now-1days", "-o", "JobID"],
                             capture_output=True, text=True, check=True).stdout
        ids = [x for x in out.split() if x]
        if ids or time.monotonic() > deadline:
            return ids
        time.sleep(1)


@pytest.fixture(scope="module")
def multinode_timeout_trial(slurm, tmp_path_factory):
    """A 2-node trial (one task on each node) past its time limit: submitted when the module
    starts, beside timeout_trial, checked near its end."""
    from moetune.experiment.config import TrainingConfig
    from moetune.store import Store
    from tests.conftest import proxy_model
    tmp = tmp_path_factory.mktemp("timeout2")
    store = Store(str(tmp / "store.db"))
    cluster = long_cluster(time_limit=1, nodes=2, ntasks_per_node=1, name="test-2node")
    st = store.create_study("timeout2", "moe_proxy", {"model": proxy_model(), "executor": "slurm",
                                                      "cluster": cluster})
    cfg = TrainingConfig(train_iters=100000)
    tid = store.add_trial(st.id, cfg.to_dict(), cfg.config_hash()).id
    store.update_trial(tid, folder=str(tmp / "runs" / "timeout2" / str(tid)))
    submitted(store, tid)
    return store, tid


@pytest.fixture(scope="module")
def timeout_trial(slurm, tmp_path_factory, multinode_timeout_trial):
    """Submitted when the module starts, checked near its end."""
    from moetune.experiment.config import TrainingConfig
    from moetune.store import Store
    from tests.conftest import proxy_model
    tmp = tmp_path_factory.mktemp("timeout")
    store = Store(str(tmp / "store.db"))
    st = store.create_study("timeout", "moe_proxy", {"model": proxy_model(), "executor": "slurm",
                                                     "cluster": long_cluster(time_limit=1)})
    cfg = TrainingConfig(train_iters=100000)
    tid = store.add_trial(st.id, cfg.to_dict(), cfg.config_hash()).id
    store.update_trial(tid, folder=str(tmp / "runs" / "timeout" / str(tid)))
    submitted(store, tid)
    return store, tid


HOST_OOM = {"nsys": "off", "mem": "300M", "stand_in": {"ms_per_iter": 50, "alloc_mb": 800}}


def test_job_over_its_memory_ends_out_of_memory(slurm, timeout_trial, make_trial):
    """Over its --mem, Slurm's cgroup kills the job: OUT_OF_MEMORY, recorded as the node's memory
    (trial state, the log's failure), never as the GPU's memory wall."""
    store, tid = make_trial(cluster=stand_in_cluster(**HOST_OOM), study="oom")
    submitted(store, tid)
    stages.run_stages(store, tid, through="analyze", poll_s=1, timeout_s=120)
    state = json.loads((Path(store.trial(tid).folder) / "state.json").read_text())
    assert state["state"] == "OUT_OF_MEMORY" and state["outcome"] == "host_oom" and not state["retry"]
    assert "cluster.mem" in state["advice"]
    assert store.trial(tid).state == "host_oom"
    analysis = json.loads((Path(store.trial(tid).folder) / "analysis.json").read_text())
    assert analysis["log"]["failure"] == "host_oom" and analysis["wall"] != "memory"
    # why the job failed, from the file submitit's JobPaths names (stderr goes to its stdout here)
    ref = stages.load_ref(stages.TrialContext(store, tid))
    assert ref.paths.stdout.exists() and "exited with status" in run.job_error(ref)


def test_tuner_answers_host_oom_with_no_gpu_memory_fix(slurm, timeout_trial, tmp_path):
    """A study whose baseline goes over the node's memory on Slurm: the trial is host_oom, the
    decision says what to do about host memory, the rule table offers no GPU memory fix for its
    analysis, no fix is applied, and the study still ends with a stop and its reports."""
    from moetune.decide import rules as rules_mod
    from moetune.report.study import write_reports
    from moetune.experiment.config import TrainingConfig
    from moetune.experiment.schema import load_experiment
    from moetune.store import Store
    from moetune.tune import loop as tuner
    from tests.conftest import stand_in_experiment
    path = stand_in_experiment(tmp_path, "host_oom", {"python": sys.executable, **HOST_OOM},
                               {"budget_trials": 3, "patience": 2})
    store = Store(str(tmp_path / "db.sqlite"))
    s = tuner.tune(path, store, executor="slurm", runs_root=tmp_path / "runs", progress=False)
    study = store.study(s["study"])
    base, = store.trials(study.id)
    assert base.state == "host_oom" and jobs.slurm_state(base.job_id).state == "OUT_OF_MEMORY"
    decisions = store.decisions(study.id)
    revert = next(d for d in decisions if d.kind == "revert")
    assert revert.trial_id == base.id and "host memory" in revert.reason and "cluster.mem" in revert.reason
    assert not [d for d in decisions if d.kind == "apply"]
    assert decisions[-1].kind == "stop" and "host_oom" in decisions[-1].reason
    analysis = json.loads((Path(base.folder) / "analysis.json").read_text())
    exp = load_experiment(path)
    offered = rules_mod.proposals(analysis, TrainingConfig.from_dict(base.config), exp.model, exp.cluster,
                                  exp.tuning)
    assert not [p.rule.id for p in offered if p.rule.wall == "memory"]
    md, html = write_reports(store, study.name, tmp_path / "reports")
    assert "host_oom" in md.read_text() and html.exists()


def test_cancelled_job_is_not_retried(slurm, timeout_trial, make_trial):
    """A job cancelled with scancel ends the trial cancelled, not retried, and submitting again starts
    no second job."""
    store, tid = make_trial(cluster=long_cluster(), study="cancel", train_iters=100000)
    job = submitted(store, tid)
    wait_running(job)
    subprocess.run(["scancel", job], check=True)
    stages.run_stage(store, tid, "collect", poll_s=1, timeout_s=60)
    assert store.trial(tid).state == "cancelled"
    assert jobs.slurm_state(job).outcome.retry is False
    stages.run_stage(store, tid, "submit")  # current: a cancelled trial is not submitted again
    name = json.loads((Path(store.trial(tid).folder) / "job.json").read_text())["name"]
    assert jobs_named(name) == [job]


def _slurmctld_pid() -> int:
    return int(Path("/run/slurm/slurmctld.pid").read_text())


def restart_slurmctld() -> None:
    pid = _slurmctld_pid()
    os.kill(pid, signal.SIGTERM)
    for _ in range(120):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.25)
    subprocess.run(["/usr/sbin/slurmctld"], check=True)
    for _ in range(120):
        if "UP" in subprocess.run(["scontrol", "ping"], capture_output=True, text=True).stdout:
            return
        time.sleep(0.25)
    raise AssertionError("slurmctld did not come back")


def test_slurmctld_restart_while_a_job_runs(slurm, timeout_trial, make_trial):
    """A slurmctld restart while the job runs does not lose it: the trial completes with all its
    iterations logged."""
    store, tid = make_trial(cluster=long_cluster(), study="restart", train_iters=100)  # ~10 s
    job = submitted(store, tid)
    wait_running(job)
    restart_slurmctld()
    # a step that ended while slurmctld was away is reported when slurmd retries (up to ~1 min)
    stages.run_stage(store, tid, "collect", poll_s=1, timeout_s=240)
    assert store.trial(tid).state == "completed"
    assert "iteration      100/     100" in (Path(store.trial(tid).folder) / "log.txt").read_text()




def test_tuner_killed_between_submit_and_collect_resumes(slurm, timeout_trial, make_trial):
    """A tuner killed between submit and collect resumes the unfinished trial to completion with the one
    job it submitted."""
    store, tid = make_trial(cluster=long_cluster(), study="killed", train_iters=60)
    kill_tuner_after_submit(store, tid, poll_s=1)
    study_id = store.trial(tid).study_id
    assert stages.unfinished(store, study_id) == [tid]
    out = stages.resume(store, study_id, poll_s=1, timeout_s=120)
    assert tid in out and store.trial(tid).state == "completed"
    assert stages.unfinished(store, study_id) == []
    name = json.loads((Path(store.trial(tid).folder) / "job.json").read_text())["name"]
    assert jobs_named(name) == [store.trial(tid).job_id]  # one job, never a second


def test_killed_right_after_sbatch_reattaches_not_resubmits(slurm, timeout_trial, make_trial):
    """A job submitted whose id never reached the store is found by name and reattached, not submitted
    twice."""
    store, tid = make_trial(cluster=long_cluster(), study="lostid", train_iters=20)
    stages.run_stage(store, tid, "render")
    t = stages.TrialContext(store, tid)
    ref = jobs.submit(stages.load_spec(t), "slurm")  # the job exists; its id never reached the store
    stages.run_stage(store, tid, "submit")
    assert store.trial(tid).job_id == ref.job_id
    stages.run_stage(store, tid, "collect", poll_s=1, timeout_s=120)
    assert jobs_named(ref.name) == [ref.job_id]


def test_job_past_its_time_limit_ends_timeout(timeout_trial):
    """A job past its time limit ends TIMEOUT in Slurm and timeout in the store, not to be retried."""
    store, tid = timeout_trial
    stages.run_stage(store, tid, "collect", poll_s=2, timeout_s=240)
    state = json.loads((Path(store.trial(tid).folder) / "state.json").read_text())
    assert state["state"] == "TIMEOUT" and store.trial(tid).state == "timeout"
    assert not state["retry"]


def hostnames(nodelist: str) -> list[str]:
    return subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                          text=True, check=True).stdout.split()


def rank_running(pid: int) -> bool:
    try:
        return b"moetune.workloads.cpu_workload" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_multinode_job_past_its_time_limit_ends_timeout_on_every_node(multinode_timeout_trial):
    """A two-node job past its time limit ends TIMEOUT, with no rank left running on either node and its
    step ended on both."""
    store, tid = multinode_timeout_trial
    stages.run_stage(store, tid, "collect", poll_s=2, timeout_s=240)
    folder = Path(store.trial(tid).folder)
    state = json.loads((folder / "state.json").read_text())
    assert state["state"] == "TIMEOUT" and store.trial(tid).state == "timeout"
    assert not state["retry"]
    nodes = hostnames(state["node"])
    assert len(nodes) == 2
    seen = [json.loads((folder / f"rank_{r}.json").read_text()) for r in (0, 1)]
    assert [s["slurm_node"] for s in seen] == nodes  # a rank ran on each node
    # the time limit ended the training on both nodes: no rank is left running on either
    deadline = time.monotonic() + 30
    while any(rank_running(s["pid"]) for s in seen) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [s["slurm_node"] for s in seen if rank_running(s["pid"])]
    out = subprocess.run(["sacct", "-n", "-P", "-j", f"{state['job_id']}.0", "-o", "State,NodeList"],
                         capture_output=True, text=True, check=True).stdout.split()
    step_state, step_nodes = out[0].split("|")
    assert hostnames(step_nodes) == nodes and step_state.split()[0] in ("CANCELLED", "TIMEOUT")


def test_node_down_while_a_job_runs_is_node_fail_then_resumes(slurm, make_trial):
    """A node set down under a running job gives NODE_FAIL, to be retried; once back, the trial runs
    again as a new job, keeping the failed attempt's files."""
    store, tid = make_trial(cluster=long_cluster(), study="nodefail", train_iters=100000)
    job = submitted(store, tid)
    wait_running(job)
    node = jobs.slurm_state(job).node  # that job's node only: other jobs run on the others
    assert node in slurm["nodes"]
    try:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=test"],
                       check=True)
        stages.run_stage(store, tid, "collect", poll_s=1, timeout_s=120)
    finally:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
    state = json.loads((Path(store.trial(tid).folder) / "state.json").read_text())
    assert state["state"] == "NODE_FAIL" and state["retry"] is True
    assert store.trial(tid).state == "node_fail"
    # resumable: the node is back and the same trial runs again (a short config this time)
    store.update_trial(tid, config={**store.trial(tid).config, "train_iters": 10})
    stages.run_stage(store, tid, "render")
    stages.run_stage(store, tid, "submit", force=True)
    assert store.trial(tid).job_id != job
    stages.run_stage(store, tid, "collect", poll_s=1, timeout_s=120)
    assert store.trial(tid).state == "completed"
    assert (Path(store.trial(tid).folder) / "previous" / job / "state.json").exists()
    assert jobs.slurm_state(job).state == "NODE_FAIL"  # not requeued by Slurm behind our back
