"""A regular install works from anywhere: the wheel built from this checkout, installed into a
fresh venv, plans, checks and tunes the CPU stand-in from another directory, with the experiments
and job templates it ships; and it claims no top-level name but `moetune`."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import stand_in_experiment

REPO = Path(__file__).resolve().parents[2]


def run(cmd, cwd, timeout=600):
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{cmd}: {r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return r.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the wheel, the fresh venv's bin folder)."""
    tmp = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp / "dist", REPO], cwd=tmp)
    wheel, = (tmp / "dist").glob("moetune-*.whl")
    run([sys.executable, "-m", "venv", tmp / "venv"], cwd=tmp)
    run([tmp / "venv" / "bin" / "python", "-m", "pip", "install", "-q", wheel], cwd=tmp)
    return wheel, tmp / "venv" / "bin"


def test_the_wheel_claims_only_moetune(installed):
    """The wheel installs only the moetune package, with its rules and workloads inside it, and the
    experiments and templates as data under share/moetune/, where the installed moetune finds them."""
    wheel, bin_ = installed
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith((".dist-info", ".data"))} == {"moetune"}
    for shipped in ("moetune/decide/rules.yaml", "moetune/experiment/megatron_flags.txt",
                    "moetune/workloads/cpu_workload.py", "moetune/analysis/__init__.py"):
        assert shipped in names
    data = [n for n in names if ".data/data/share/moetune/" in n]
    assert any(n.endswith("experiments/qwen3_235b.yaml") for n in data)
    assert any(n.endswith("sbatch_templates/sbatch.j2") for n in data)
    prefix = bin_.parent
    assert (prefix / "share" / "moetune" / "experiments" / "qwen3_235b.yaml").is_file()


def test_plan_and_check_from_another_directory(installed, tmp_path):
    """The installed moetune plans a layout and checks a command line from outside the checkout."""
    _, bin_ = installed
    out = run([bin_ / "moetune", "plan", "qwen3_235b", "--gpus", "256", "--gpu-type", "H100"], cwd=tmp_path)
    assert out.startswith("qwen3_235b on 256x H100") and "GB/GPU" in out
    out = run([bin_ / "moetune", "check", "--gpus", "8", "--", "--num-layers", "8", "--num-attention-heads",
               "16", "--num-experts", "16", "--expert-model-parallel-size", "8", "--micro-batch-size", "1",
               "--global-batch-size", "64"], cwd=tmp_path)
    assert out.strip() == "ok"


def test_tune_the_cpu_stand_in_from_another_directory(installed, tmp_path):
    """The installed moetune tunes the CPU stand-in from outside the checkout, writing its report and
    store, with the installed workload as the job."""
    _, bin_ = installed
    # the job's python: the fresh venv's own (the venv template's default), not this one
    stand_in_experiment(tmp_path, "wheel_stand_in", tuning={"budget_trials": 2, "patience": 1})
    out = run([bin_ / "moetune", "tune", "wheel_stand_in.yaml", "--executor", "local", "--no-progress"],
              cwd=tmp_path)
    assert "study wheel_stand_in:" in out
    assert (tmp_path / "reports" / "wheel_stand_in.md").exists()
    assert (tmp_path / ".moetune" / "moetune.db").exists()
    log = next((tmp_path / "runs" / "wheel_stand_in").glob("*/log.txt")).read_text()
    assert "iteration" in log  # the installed workload script ran as the job


def test_demo_names_the_bank_it_needs_then_replays_it(installed, tmp_path):
    """The wheel ships no trial bank (54 MiB of recorded traces): `moetune demo` from it says so in
    one line naming --bank and MOETUNE_BANK, exit 2, and makes no folder; given a checkout's bank
    by --bank or MOETUNE_BANK, the installed demo replays it to its report."""
    _, bin_ = installed
    r = subprocess.run([bin_ / "moetune", "demo"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    line, = r.stderr.strip().splitlines()
    assert "no trial bank here" in line and "--bank" in line and "MOETUNE_BANK" in line
    assert list(tmp_path.iterdir()) == []
    bank = REPO / "data" / "trial_bank"
    out = run([bin_ / "moetune", "demo", "--bank", bank, "--no-progress"], cwd=tmp_path, timeout=600)
    assert "study moe_proxy-replay: 3 trials, best 253.5 ms/step (baseline 461.7 ms, judged)" in out
    assert (tmp_path / "reports" / "moe_proxy-replay.md").exists()
    env = {**os.environ, "MOETUNE_BANK": str(bank)}
    r = subprocess.run([bin_ / "moetune", "demo", "--no-progress"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr  # the same study again: resumed from the store, nothing replayed
    assert "best 253.5 ms/step" in r.stdout


def test_every_package_folder_is_a_package_for_the_wheel():
    """pyproject finds the packages under moetune/ by their __init__.py: every folder of moetune/
    holding Python files has one (one without it installs nothing and fails on import)."""
    for py in (REPO / "moetune").rglob("*.py"):
        assert (py.parent / "__init__.py").exists(), f"{py.parent} has no __init__.py"
