"""The single-host communication experiments (qwen3_30b_a3b_ep2 on 2 GPUs, qwen3_30b_a3b_ep4 on 4,
qwen3_30b_a3b_ep8 on 8) and their sweeps are ready for the GPU machine: each config passes moetune's constraint table and
Megatron 0.19.2's own validation for the experiment's GPUs on the TE image, and each baseline fits
by the calibrated estimate."""
import importlib.util
from pathlib import Path

import pytest

from moetune.estimate.memory import baseline_layout
from moetune.experiment import megatron_validate as mv
from moetune.experiment.constraints import check
from moetune.experiment.schema import load_experiment

SPEC = importlib.util.spec_from_file_location(
    "comm_sweep", Path(__file__).resolve().parents[2] / "benchmarks" / "device" / "comm_sweep.py")
sweep = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(sweep)
EXPERIMENTS = {name: load_experiment(name) for name in ("qwen3_30b_a3b_ep2", "qwen3_30b_a3b_ep4", "qwen3_30b_a3b_ep8")}
RUNS = [(exp, name, changes) for exp in EXPERIMENTS for name, changes, _ in sweep.sweep(EXPERIMENTS[exp])]


@pytest.mark.parametrize("name, gpus, ep, layers", [
    ("qwen3_30b_a3b_ep2", 2, 2, 8), ("qwen3_30b_a3b_ep4", 4, 4, 16), ("qwen3_30b_a3b_ep8", 8, 8, 48)])
def test_each_baseline_fits_its_host(name, gpus, ep, layers):
    """The EP 2 baseline (8 layers) fits two 80 GB GPUs, the EP 4 one (16 layers) four, the EP 8 one
    (48 layers) eight H200."""
    exp = EXPERIMENTS[name]
    layout = baseline_layout(exp)
    assert layout.fits and exp.cluster.gpus == gpus and layout.config.ep == ep and exp.model.num_layers == layers


@pytest.mark.parametrize("exp, name, changes", RUNS)
def test_each_sweep_config_passes_the_constraint_table(exp, name, changes):
    """Each config of each sweep passes moetune's constraint table."""
    e = EXPERIMENTS[exp]
    assert check(sweep.config(e, changes), e.model, e.cluster) == [], name


def test_the_sweep_holds_every_dispatcher_overlap_folding_and_the_slow_link():
    """What the communication chapter asks to measure is in the EP 4 sweep, and the slow link sends
    NCCL through host memory for the baseline and both overlaps, never for a DeepEP/HybridEP run."""
    runs = {name: (changes, env) for name, changes, env in sweep.sweep(EXPERIMENTS["qwen3_30b_a3b_ep4"])}
    backends = {c.get("flex_backend", c.get("dispatcher", "alltoall")) for c, _ in runs.values()}
    assert {"alltoall", "deepep", "hybridep"} <= backends
    assert runs["ep4_ep2_etp2"][0] == {"ep": 2, "etp": 2}
    assert runs["ep4_overlap_wgrad"][0] == {"overlap_ep_a2a": True, "delay_wgrad": True}
    slow = {n for n, (_, env) in runs.items() if env == {"NCCL_P2P_DISABLE": "1"}}
    assert {"ep4_slow_baseline", "ep4_slow_overlap", "ep4_slow_overlap_wgrad"} <= slow
    assert all("flex_backend" not in runs[n][0] for n in slow)


def test_each_run_exports_what_moetune_renders_for_its_config(capsys):
    """The overlap and flex-dispatcher runs get more than one CUDA connection (Megatron's EP overlap
    needs it) and HybridEP its NVLink domain, as a trial's job script would; a slow-link run keeps
    its own variable beside them; a pinned run names its cores."""
    assert sweep.main(["qwen3_30b_a3b_ep4", "ep4_overlap", "ep4_hybridep", "ep4_slow_overlap", "ep4_baseline",
                       "ep4_baseline_cpus4_balanced"]) == 0
    env = {line.split()[0]: dict(kv.split("=", 1) for kv in line.split()[2].split(","))
           for line in capsys.readouterr().out.splitlines()}
    assert env["ep4_overlap"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    assert env["ep4_hybridep"]["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"] == "4"
    assert env["ep4_slow_overlap"]["NCCL_P2P_DISABLE"] == "1"
    assert env["ep4_slow_overlap"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in env["ep4_baseline"]
    assert env["ep4_baseline_cpus4_balanced"]["CPUS"] == "16"


def test_the_script_names_an_unknown_run_in_one_line(capsys):
    """A run name the sweep does not hold is one line listing the runs, exit 2."""
    assert sweep.main(["qwen3_30b_a3b_ep4", "ep4_nosuch"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "ep4_nosuch" in err and "ep4_baseline" in err


@pytest.mark.megatron
@pytest.mark.skipif(not mv.available(), reason="no .venv-megatron (scripts/megatron-venv)")
@pytest.mark.parametrize("exp", sorted(EXPERIMENTS))
def test_megatron_accepts_each_sweep_config(exp):
    """Megatron's own validation accepts every config of the sweep."""
    e = EXPERIMENTS[exp]
    runs = sweep.sweep(e)
    argvs = [sweep.argv(e, sweep.config(e, c)) for _, c, _ in runs]
    refused = dict(zip([n for n, _, _ in runs], mv.validate(argvs, e.cluster.gpus)))
    assert {n: r for n, r in refused.items() if r} == {}
