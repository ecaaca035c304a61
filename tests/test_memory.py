"""The memory estimate: published parameter counts, what each knob saves, the plan's order, and
agreement with Megatron's own theoretical figure on weights and optimizer states."""
import json

import pytest

from pipeline import megatron_validate as mv
from pipeline.config import run_args
from pipeline.experiment import load_experiment
from pipeline.memory import count_params, estimate, mtp_params, plan

PUBLISHED_B = {"qwen3_235b": 235, "qwen3_30b_a3b": 30.5, "mixtral_8x7b": 46.7, "mixtral_8x22b": 141,
               "deepseek_v3": 671 + 14}  # DeepSeek-V3: 671 B main model + 14 B MTP module


@pytest.mark.parametrize("name, billions", PUBLISHED_B.items())
def test_parameter_counts_match_published(name, billions):
    m = load_experiment(name).model
    total = (count_params(m).total + mtp_params(m).total) / 1e9
    assert total == pytest.approx(billions, rel=0.02)


def test_knobs_move_the_estimate_the_right_way():
    e = load_experiment("qwen3_30b_a3b")
    base = estimate(e.model, e.baseline, 16)
    no_distopt = estimate(e.model, e.baseline.replace(distributed_optimizer=False), 16)
    assert no_distopt.optimizer_gb > 1.5 * base.optimizer_gb
    pao = estimate(e.model, e.baseline.replace(precision_aware_optimizer=True), 16)
    assert pao.optimizer_gb < base.optimizer_gb
    sel = estimate(e.model, e.baseline.replace(recompute_granularity="selective",
                                               recompute_modules=["moe_act", "layernorm"]), 16)
    full = estimate(e.model, e.baseline.replace(recompute_granularity="full", recompute_num_layers=1), 16)
    assert full.activations_gb < sel.activations_gb < base.activations_gb
    assert estimate(e.model, e.baseline.replace(micro_batch=2, global_batch=1024), 16).activations_gb > \
        1.8 * base.activations_gb
    assert estimate(e.model, e.baseline.replace(ep=8), 16).weights_gb > base.weights_gb


def test_plan_least_model_parallel_first(capsys):
    e = load_experiment("mixtral_8x7b")
    layouts = plan(e, gpus=64, limit=50)
    assert layouts
    mp = [l.model_parallel for l in layouts]
    assert mp == sorted(mp)
    assert all(l.memory_gb < 0.9 * 80 for l in layouts)
    from pipeline.cli import main
    assert main(["plan", "mixtral_8x7b", "--gpus", "64", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out and {"args", "memory_gb"} <= set(out[0]) and "--expert-model-parallel-size" in out[0]["args"]


def test_plan_refuses_what_cannot_fit():
    e = load_experiment("deepseek_v3")
    assert plan(e, gpus=8) == []  # 685 B parameters do not fit on one H100 node


@pytest.mark.megatron
@pytest.mark.skipif(not mv.available(), reason="no .venv-megatron (scripts/megatron-venv)")
def test_model_state_within_10_percent_of_megatron():
    names = list(PUBLISHED_B)
    exps = [load_experiment(n) for n in names]
    theirs = mv.theoretical_memory([e.baseline.to_args(e.model) + run_args() for e in exps],
                                   [e.cluster.gpus for e in exps])
    for n, e, t in zip(names, exps, theirs):
        ours = estimate(e.model, e.baseline, e.cluster.gpus).model_state_gb
        assert ours == pytest.approx(t[0] / 1024, rel=0.10), n
