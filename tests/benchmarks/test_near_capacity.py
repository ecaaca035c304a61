"""A completed run busy on compute with its allocator near the GPU's capacity, recorded on one H100
(tests/data/gpu/near_capacity, made by benchmarks/near_capacity.py): it is not memory-walled, the
near-capacity row stands in its evidence as a limit, and it bars the fixes that grow memory. (The
same run's fit logs are read in tests/experiment/test_fit.py.)"""
import json
from pathlib import Path

import pytest

from moetune import analysis
from moetune.decide import rules
from moetune.experiment.config import TrainingConfig
from moetune.experiment.schema import load_experiment

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu" / "near_capacity"
GROWS_MEMORY = {"larger_micro_batch", "compute_larger_micro_batch"}


@pytest.fixture(scope="module")
def recorded():
    return analysis.analyze([DATA / "trace.sqlite.xz"], log=DATA / "log.txt.xz")


def test_a_compute_busy_run_near_capacity_is_not_memory_walled(recorded):
    """A recorded busy run at 96% of the H100's memory is the compute wall, with memory only as a limit
    on growing fixes."""
    c = recorded["metrics"]["combined"]
    assert recorded["gpu_memory_gb"] == pytest.approx(79.18, abs=0.01)  # the H100, from the trace
    assert recorded["log"]["failure"] is None and recorded["log"]["iterations"] == 16
    assert c["gpu_idle_share"] < 0.1 and c["sm_util_estimate"] > 0.9  # busy on compute
    assert recorded["wall"] == "compute"
    near = next(e for e in recorded["evidence"] if e["rule"] == "memory_near_capacity")
    assert near["wall"] is None and near["limits"].startswith("memory: fixes that grow memory")
    assert near["value"] == pytest.approx(75.767 / 79.18, abs=0.002) and near["value"] >= 0.92
    assert [e["rule"] for e in recorded["evidence"] if e["wall"]] == ["busy_compute"]


def test_near_capacity_bars_the_fixes_that_grow_memory(recorded):
    """The recorded run's proposals leave out a larger micro batch; the same trace read against a
    GPU with room (its peak a half of an H200's 141 GB) proposes it."""
    info = json.loads((DATA / "config.json").read_text())
    info.pop("variant")
    exp = load_experiment(info.pop("experiment"))
    config = TrainingConfig.from_dict(info)
    assert (config.tp, config.pp, config.ep, config.micro_batch) == (2, 1, 8, 2)
    cluster = exp.cluster
    near = {p.rule.id for p in rules.proposals(recorded, config, exp.model, cluster, exp.tuning)}
    roomy = {p.rule.id for p in rules.proposals({**recorded, "gpu_memory_gb": 141.0}, config, exp.model,
                                                cluster, exp.tuning)}
    assert near and not near & GROWS_MEMORY
    assert "compute_larger_micro_batch" in roomy


