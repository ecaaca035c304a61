"""A node dies while a 2-node trial of a tuning study runs, on the real 3-node Slurm of
scripts/slurm-up. The node's death: its slurmd is SIGKILLed (slurmctld hears nothing from
it any more) and the trial's rank on it is SIGSTOPped (a dead node's processes make no progress;
killed outright, the step would fail at once and the job end FAILED, which a real dead node does
not do). With JobRequeue=0 and --no-requeue the job ends NODE_FAIL (SlurmdTimeout=10: ~25 s);
the tuner records a `retry` and submits the same trial again: it completes on the two nodes left. The slurmd is started again at teardown
(scripts/slurm-up), so the cluster is whole for the tests after this one."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from moetune.job import scheduler as jobs
from moetune.tune import loop as tuner
from moetune.tune.state import JUDGED
from moetune.store import Store
from tests.conftest import REPO, slurm_up

pytestmark = pytest.mark.slurm


def experiment(tmp_path) -> str:
    exp = yaml.safe_load((REPO / "experiments" / "moe_proxy.yaml").read_text())
    exp["name"] = "two_node_stand_in"
    exp["cluster"] = {"name": "cpu-2node", "template": "venv", "workload": "cpu_stand_in",
                      "nodes": 2, "gpus_per_node": 1, "ntasks_per_node": 1, "cpus_per_task": 1,
                      "mem": "500M", "gpu_type": "H100", "time_limit": "00:05:00", "nsys": "off",
                      "python": sys.executable, "has_transformer_engine": False,
                      "stand_in": {"ms_per_iter": 40, "busy": 0.2}}
    # token drop allowed: a second rule applies to the stand-in's analysis, so the study has a
    # trial to run after the one the node failure ends
    exp["tuning"] = {"budget_trials": 3, "patience": 3, "hang_timeout_s": 300,
                     "allow_token_drop": True}
    # ~4 s of iterations: the rank on the dying node is stopped well before it ends
    exp["baseline"] = dict(exp["baseline"], train_iters=100, profile_step_start=4, profile_step_end=7)
    path = tmp_path / "two_node_stand_in.yaml"
    path.write_text(yaml.safe_dump(exp))
    return str(path)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class NodeKiller(threading.Thread):
    """Waits for the second trial's rank 1 (on the job's second node) to report in, then kills
    that node: its slurmd SIGKILLed, the rank SIGSTOPped. Notes what the baseline had measured."""

    def __init__(self, runs: Path, db: str):
        super().__init__(daemon=True)
        self.runs, self.db = runs, db
        self.done = threading.Event()
        self.stop = threading.Event()
        self.node = self.pid = self.folder = None
        self.baseline: dict = {}

    def run(self):
        while not self.stop.is_set():
            found = [p for p in self.runs.glob("*/*/rank_1.json") if p.parent.name != "1"]
            if found:
                break
            time.sleep(0.1)
        else:
            return
        seen = json.loads(found[0].read_text())
        self.folder, self.node, self.pid = found[0].parent, seen["slurm_node"], seen["pid"]
        store = Store(self.db)
        base = store.trials(store.studies()[0].id)[0]
        self.baseline = {"state": base.state, "metrics": store.metrics(base.id),
                         "analysis": digest(Path(base.folder) / "analysis.json")}
        os.kill(int(Path(f"/run/slurm/slurmd-{self.node}.pid").read_text()), signal.SIGKILL)
        os.kill(self.pid, signal.SIGSTOP)
        self.at = time.monotonic()
        self.done.set()


def node_state(node: str) -> str:
    return subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_node_dies_during_a_two_node_trial_and_the_study_goes_on(slurm, tmp_path):
    """A node killed during a two-node trial leaves NODE_FAIL in Slurm's accounting, a retry decision
    keeping the failed attempt's files, and a study that goes on."""
    slurm_up()  # all nodes up, whatever an earlier test left
    runs, db = tmp_path / "runs", str(tmp_path / "db.sqlite")
    store = Store(db)
    killer = NodeKiller(runs, db)
    killer.start()
    try:
        s = tuner.tune(experiment(tmp_path), store, executor="slurm", runs_root=runs, progress=False)
        dead_still = node_state(killer.node) if killer.done.is_set() else None
    finally:
        killer.stop.set()
        killer.join(5)
        if killer.pid:
            for sig in (signal.SIGKILL, signal.SIGCONT):
                try:
                    os.kill(killer.pid, sig)
                except ProcessLookupError:
                    pass
        slurm_up()  # the dead node's slurmd again: the cluster is whole for the next tests
    assert killer.done.is_set(), "the second trial never started on two nodes"
    study = store.study(s["study"])
    base, failed, *rest = store.trials(study.id)
    assert Path(failed.folder) == killer.folder

    # the failed job: NODE_FAIL in Slurm's accounting, not requeued, followed to its end
    retry = next(d for d in store.decisions(study.id) if d.kind == "retry")
    first_job = retry.evidence["job_id"]
    assert retry.trial_id == failed.id and retry.evidence["state"] == "node_fail"
    assert "NODE_FAIL" in retry.reason and "no step time" not in retry.reason
    before = killer.folder / "previous" / first_job  # the failed attempt's files are kept
    state = json.loads((before / "state.json").read_text())
    assert state["state"] == "NODE_FAIL" and state["retry"] is True
    assert killer.node in subprocess.run(["scontrol", "show", "hostnames", state["node"]],
                                         capture_output=True, text=True).stdout.split()
    assert jobs.slurm_state(first_job).state == "NODE_FAIL"
    records = subprocess.run(["sacct", "-X", "-D", "-n", "-P", "-j", first_job, "-o",
                              "State"], capture_output=True, text=True, check=True).stdout.split()
    assert records == ["NODE_FAIL"]  # one run of the job: Slurm did not requeue it

    # nothing measured before is lost
    assert killer.baseline["state"] == "completed" == store.trial(base.id).state
    assert store.metrics(base.id) == killer.baseline["metrics"] and killer.baseline["metrics"]
    assert digest(Path(base.folder) / "analysis.json") == killer.baseline["analysis"]

    # the tuner submitted the same trial again (the node's fault, not the rule's): it ran to its
    # end on the two nodes left, was judged on that measurement, and the study went on
    failed = store.trial(failed.id)
    assert failed.job_id != first_job and failed.state == "completed"
    ran_on = jobs.slurm_state(failed.job_id).node
    assert killer.node not in subprocess.run(["scontrol", "show", "hostnames", ran_on],
                                             capture_output=True, text=True).stdout.split()
    kinds = [(d.kind, d.trial_id) for d in store.decisions(study.id)]
    verdict = next(d for d in store.decisions(study.id) if d.trial_id == failed.id and d.kind in JUDGED)
    assert verdict.evidence["state"] == "completed"
    assert kinds.index(("retry", failed.id)) < kinds.index((verdict.kind, failed.id))
    # once here; more where another user's test downed a node meanwhile (the cluster is shared)
    assert 1 <= [k for k, t in kinds if t == failed.id].count("retry") <= tuner.RETRY_CAP
    after = kinds[kinds.index((verdict.kind, failed.id)) + 1:]
    assert after, "no decision after the retried trial"
    assert rest, f"no trial after the retried one: {kinds}"
    assert store.trial(rest[0].id).state == "completed"
    assert dead_still and dead_still.startswith("down")  # and it had not come back meanwhile
    assert s["trials"] == 3 and "budget" in s["stop_reason"]
