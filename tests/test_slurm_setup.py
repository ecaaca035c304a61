"""scripts/slurm-up: idempotent (a second run leaves running daemons alone) and the configuration
the tests rely on (accounting through slurmdbd, cgroup v1 memory limits, no overtime)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slurm
PIDS = ("slurmctld", "slurmd", "slurmdbd")


def pids() -> dict[str, str]:
    return {d: Path(f"/run/slurm/{d}.pid").read_text().strip() for d in PIDS}


def test_second_slurm_up_changes_nothing(slurm):
    before = pids()
    r = subprocess.run(["bash", str(REPO / "scripts/slurm-up")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "is idle" in r.stdout or "is mixed" in r.stdout or "is allocated" in r.stdout
    assert pids() == before


def test_configuration_the_tests_rely_on(slurm):
    conf = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                          check=True).stdout
    settings = dict(line.split("=", 1) for line in conf.splitlines() if " = " in line)
    settings = {k.strip(): v.strip() for k, v in settings.items()}
    assert settings["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert settings["ProctrackType"] == "proctrack/cgroup"
    assert settings["TaskPlugin"] == "task/cgroup"
    assert settings["OverTimeLimit"] == "0 min"
    assert settings["SelectTypeParameters"] == "CR_CORE_MEMORY"
    clusters = subprocess.run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"],
                              capture_output=True, text=True, check=True).stdout.split()
    assert settings["ClusterName"] in clusters
