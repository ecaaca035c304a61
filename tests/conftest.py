"""Shared pytest fixtures. Each block says whose it is; add yours in a block of its own."""
from __future__ import annotations

# ---- Slurm orchestration fixtures (scripts/slurm-up, moetune/trial/stages.py) ----------------
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def _host_cannot_run_slurm() -> str | None:
    if os.geteuid() != 0:
        return "scripts/slurm-up needs root (it installs Debian packages and starts daemons)"
    if not shutil.which("apt-get"):
        return "scripts/slurm-up needs Debian's apt-get"
    return None


@pytest.fixture(scope="session", autouse=True)
def trace_cache(tmp_path_factory):
    """Decompressed traces go to a folder of this test session, not the user's ~/.cache."""
    d = tmp_path_factory.mktemp("moetune-cache")
    old = os.environ.get("MOETUNE_CACHE")
    os.environ["MOETUNE_CACHE"] = str(d)
    yield d
    if old is None:
        os.environ.pop("MOETUNE_CACHE", None)
    else:
        os.environ["MOETUNE_CACHE"] = old


# The tests' cluster: 3 nodes on this machine (scripts/test-deps brings up the same).
# The multi-node tests need 2 nodes for a trial and a third for the study to go on when one dies.
TEST_NODES = max(3, int(os.environ.get("MOETUNE_TEST_NODES", "3")))


def slurm_up(nodes: int = TEST_NODES) -> dict:
    """scripts/slurm-up --nodes N: brings up the nodes missing (or a slurmd that died), ~1 s when
    all are up. {"node": the first node, "nodes": every node's name}."""
    r = subprocess.run(["bash", str(REPO / "scripts/slurm-up"), "--nodes", str(nodes)],
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, f"scripts/slurm-up failed:\n{r.stdout}\n{r.stderr}"
    names = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True,
                           check=True).stdout.split()
    names = sorted(set(names), key=lambda n: (len(n), n))
    return {"node": names[0], "nodes": names}


@pytest.fixture(scope="session")
def slurm():
    """The Slurm of scripts/slurm-up with TEST_NODES nodes, started once per test session."""
    why = _host_cannot_run_slurm()
    if why:
        pytest.skip(why)
    return slurm_up()


@pytest.fixture(scope="session")
def nsys_bin():
    """Debian's Nsight Systems (scripts/nsys-up, the analysis part's installer)."""
    found = shutil.which("nsys")
    if not found and (REPO / "scripts/nsys-up").exists() and os.geteuid() == 0:
        r = subprocess.run(["bash", str(REPO / "scripts/nsys-up")], capture_output=True, text=True,
                           timeout=1800)
        assert r.returncode == 0, f"scripts/nsys-up failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        found = shutil.which("nsys")
    if not found:
        pytest.skip("nsys not installed and scripts/nsys-up not available on this host")
    return found


def proxy_model() -> dict:
    return yaml.safe_load((REPO / "experiments/moe_proxy.yaml").read_text())["model"]


def proxy_variant(tmp_path, old: str, new: str) -> str:
    """experiments/moe_proxy.yaml with one text replaced, written under tmp_path: its path."""
    from moetune.paths import EXPERIMENTS
    text = (EXPERIMENTS / "moe_proxy.yaml").read_text()
    assert old in text
    path = tmp_path / "variant.yaml"
    path.write_text(text.replace(old, new, 1))
    return str(path)


def stand_in_cluster(**overrides) -> dict:
    """A cluster section that runs the CPU stand-in for training (no GPU here)."""
    c = {"name": "test-1node", "template": "venv", "workload": "cpu_stand_in", "nodes": 1,
         "gpus_per_node": 0, "cpus_per_task": 1, "mem": "1G", "time_limit": "00:05:00",
         "stand_in": {"ms_per_iter": 40}}
    c.update(overrides)
    return c


def stand_in_experiment(folder: Path, name: str, cluster: dict | None = None, tuning: dict | None = None,
                        **baseline) -> str:
    """An experiment YAML (written into `folder`) of moe_proxy whose jobs run the CPU stand-in for
    training locally: 2 GPUs' worth of one task each, no nsys, 30 ms iterations; `cluster`,
    `tuning` and the baseline's fields override."""
    exp = yaml.safe_load((REPO / "experiments" / "moe_proxy.yaml").read_text())
    exp["name"] = name
    exp["cluster"] = {"name": "cpu-1node", "template": "venv", "workload": "cpu_stand_in",
                      "nodes": 1, "gpus_per_node": 2, "ntasks_per_node": 1, "cpus_per_task": 1,
                      "gpu_type": "H100", "time_limit": "00:05:00", "nsys": "off",
                      "has_transformer_engine": False, "stand_in": {"ms_per_iter": 30}, **(cluster or {})}
    exp["tuning"] = tuning or {}
    exp["baseline"] = dict(exp["baseline"], train_iters=10, profile_step_start=4, profile_step_end=7,
                           **baseline)
    path = Path(folder) / f"{name}.yaml"
    path.write_text(yaml.safe_dump(exp))
    return str(path)


@pytest.fixture
def make_trial(tmp_path):
    """make_trial(cluster=..., executor=..., study=..., **config) -> (store, trial id)."""
    from moetune.experiment.config import TrainingConfig
    from moetune.store import Store
    store = Store(str(tmp_path / "store.db"))

    def make(cluster=None, executor="slurm", study="s", runs_root=None, **config):
        cfg = TrainingConfig(train_iters=8, profile_step_start=3, profile_step_end=6).replace(**config)
        st = store.create_study(study, "moe_proxy", {"model": proxy_model(),
                                                    "cluster": cluster or stand_in_cluster(),
                                                    "executor": executor})
        trial = store.add_trial(st.id, cfg.to_dict(), cfg.config_hash())
        root = Path(runs_root or tmp_path / "runs")
        store.update_trial(trial.id, folder=str((root / study / str(trial.id)).resolve()))
        return store, trial.id

    return make
# ---- end of Slurm orchestration fixtures ---------------------------------------------------


_TUNER_UNTIL_SUBMITTED = """
import sys
from moetune.store import Store
from moetune.trial import stages
store = Store(sys.argv[1]); tid = int(sys.argv[2])
stages.run_stage(store, tid, "render"); stages.run_stage(store, tid, "submit")
print("submitted", flush=True)
stages.run_stage(store, tid, "collect", poll_s=float(sys.argv[3]))
"""


def kill_tuner_after_submit(store, tid: int, poll_s: float) -> None:
    """A tuner process that renders and submits the trial, then is SIGKILLed while it collects."""
    p = subprocess.Popen([sys.executable, "-c", _TUNER_UNTIL_SUBMITTED, store.url.removeprefix("sqlite:///"),
                          str(tid), str(poll_s)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert p.stdout.readline().strip() == "submitted"
    p.send_signal(signal.SIGKILL)
    p.wait()


@pytest.fixture
def no_store(tmp_path, monkeypatch):
    """A command run where no store is: in an empty folder, MOETUNE_DB unset."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MOETUNE_DB", raising=False)
