"""scripts/slurm-up: idempotent (a second run with the same node count leaves running daemons
alone) and the configuration the tests rely on (accounting through slurmdbd, cgroup v1 memory
limits, no overtime, TEST_NODES nodes each with its own hostname, no requeue, a short
SlurmdTimeout)."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, TEST_NODES

pytestmark = pytest.mark.slurm
PIDS = ("slurmctld", "slurmdbd")


def pids() -> dict[str, str]:
    run = Path("/run/slurm")
    out = {d: (run / f"{d}.pid").read_text().strip() for d in PIDS}
    out.update({p.stem: p.read_text().strip() for p in run.glob("slurmd-*.pid")})
    return out


def test_second_slurm_up_changes_nothing(slurm):
    """A second scripts/slurm-up finds every node up, restarts no daemon and returns within 10 s."""
    before = pids()
    assert sorted(k for k in before if k.startswith("slurmd-")) == \
        sorted(f"slurmd-{n}" for n in slurm["nodes"])
    t0 = time.monotonic()
    r = subprocess.run(["bash", str(REPO / "scripts/slurm-up"), "--nodes", str(TEST_NODES)],
                       capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    states = dict(x.split() for x in r.stdout.split(":")[-1].strip().split(","))
    assert sorted(states) == sorted(slurm["nodes"])
    assert all(s.rstrip("*") in ("idle", "mixed", "allocated", "completing") for s in states.values())
    assert pids() == before
    assert took < 10, f"a second slurm-up took {took:.1f} s"


def test_configuration_the_tests_rely_on(slurm):
    """The Slurm configuration is the one the tests rely on: slurmdbd accounting, cgroups, no requeue, a
    short slurmd timeout."""
    conf = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                          check=True).stdout
    settings = dict(line.split("=", 1) for line in conf.splitlines() if " = " in line)
    settings = {k.strip(): v.strip() for k, v in settings.items()}
    assert settings["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert settings["ProctrackType"] == "proctrack/cgroup"
    assert settings["TaskPlugin"] == "task/cgroup"
    assert settings["OverTimeLimit"] == "0 min"
    assert settings["SelectTypeParameters"] == "CR_CORE_MEMORY"
    assert settings["JobRequeue"] == "0"  # the tuner decides what runs again (slurm-up says why)
    assert int(settings["SlurmdTimeout"].split()[0]) <= 15
    clusters = subprocess.run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"],
                              capture_output=True, text=True, check=True).stdout.split()
    assert settings["ClusterName"] in clusters
    assert len(slurm["nodes"]) == TEST_NODES


def test_every_node_runs_tasks_under_its_own_name(slurm):
    """A task on each node runs under that node's hostname, and node names resolve locally."""
    n = len(slurm["nodes"])
    r = subprocess.run(["srun", f"--nodes={n}", "--ntasks-per-node=1", "--mem=100M", "-t", "1",
                        "bash", "-c", 'echo "$SLURMD_NODENAME $(hostname) $(getent hosts "$SLURMD_NODENAME")"'],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = sorted(line.split()[:3] for line in r.stdout.splitlines())
    assert [row[0] for row in rows] == sorted(slurm["nodes"])
    for node, host, addr in rows:
        assert host == node  # unshare --uts: each slurmd has its node's hostname
        assert addr == "127.0.0.1"  # node names resolve, as a job's rendezvous address needs
