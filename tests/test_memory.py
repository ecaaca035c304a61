"""The memory estimate: published parameter counts, what each knob saves, the plan's order, and
agreement with Megatron's own theoretical figure on weights and optimizer states."""
import json

import pytest

from moetune.pipeline.spec import megatron_validate as mv
from moetune.pipeline.spec.config import run_args
from moetune.pipeline.spec.experiment import load_experiment
from moetune.pipeline.spec.memory import count_params, estimate, mtp_params, plan

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
    offloaded = [base.activations_gb]
    for mods in (["qkv_linear"], ["qkv_linear", "core_attn", "attn_proj"],
                 ["qkv_linear", "core_attn", "attn_proj", "expert_fc1"],
                 ["qkv_linear", "core_attn", "attn_proj", "expert_fc1", "moe_act"]):
        offloaded.append(estimate(e.model, e.baseline.replace(offload_modules=mods), 16).activations_gb)
    assert offloaded == sorted(offloaded, reverse=True) and len(set(offloaded)) == 5  # each one saves
    assert estimate(e.model, e.baseline.replace(micro_batch=2, global_batch=1024), 16).activations_gb > \
        1.8 * base.activations_gb
    assert estimate(e.model, e.baseline.replace(ep=8), 16).weights_gb > base.weights_gb


def test_plan_least_model_parallel_first(capsys):
    e = load_experiment("mixtral_8x7b")
    layouts = plan(e, gpus=64, limit=50)
    assert layouts
    mp = [l.tp_pp for l in layouts]
    assert mp == sorted(mp)
    assert all(l.memory_gb < 0.9 * 80 for l in layouts)
    shapes = [(l.config.tp, l.config.pp, l.config.ep) for l in layouts]
    assert len(shapes) == len(set(shapes))  # one entry a layout
    with_recompute = [l for l in layouts if l.config.recompute_modules]
    assert with_recompute  # some layouts fit only with selective recompute ...
    for l in with_recompute:  # ... and only those get it
        bare = l.config.replace(recompute_granularity=None, recompute_modules=())
        assert estimate(e.model, bare, 64).total_gb > 0.9 * 80
    from moetune.pipeline.cli.main import main
    assert main(["plan", "mixtral_8x7b", "--gpus", "64", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out and {"args", "memory_gb"} <= set(out[0]) and "--expert-model-parallel-size" in out[0]["args"]


def test_plan_refuses_what_cannot_fit():
    e = load_experiment("deepseek_v3")
    assert plan(e, gpus=8) == []  # 685 B parameters do not fit on one H100 node


@pytest.mark.megatron
@pytest.mark.skipif(not mv.available(), reason="no .venv-megatron (scripts/megatron-venv)")
def test_model_state_within_10_percent_of_megatron():
    # deepseek_v3's baseline is left out on purpose since the fit-lease calibration: its first stage
    # holds 3 dense layers (--decoder-first-pipeline-num-layers 3), which Megatron's figure prices
    # as an even share of MoE layers plus MTP (20.0 GB); the measured model state on that rank is
    # 8.1 GB and ours 8.1 GB (tests/test_memory_fit.py)
    names = [n for n in PUBLISHED_B if n != "deepseek_v3"]
    exps = [load_experiment(n) for n in names]
    theirs = mv.theoretical_memory([e.baseline.to_args(e.model) + run_args() for e in exps],
                                   [e.cluster.gpus for e in exps])
    for n, e, t in zip(names, exps, theirs):
        ours = estimate(e.model, e.baseline, e.cluster.gpus).model_state_gb
        assert ours == pytest.approx(t[0] / 1024, rel=0.10), n


def test_estimate_within_10_percent_of_measured_peak():
    """Real GPU runs (trial bank: moe_proxy on 1-2x H200, local attention, Megatron's max allocated):
    the MoE-aware estimate without the fixed overhead lands within 10 % of the measured peak, 15 %
    where the EP all-to-all overlap adds its buffers (not modelled), and the unfused attention's
    score matrix is what makes longer sequences cost more than linearly."""
    from moetune.pipeline.spec.config import TrainingConfig
    from moetune.pipeline.paths import ROOT as REPO
    bank = [json.loads(line) for line in (REPO / "benchmarks/trial_bank/bank.jsonl").read_text().splitlines()
            if line.strip()]
    proxy = load_experiment("moe_proxy")
    # moe_proxy's sweep; a tuning study's trials (benchmarks/one_gpu_tuning.py) are other models
    done = [b for b in bank if b["state"] == "COMPLETED" and b["peak_memory_gb"] and not b.get("study")]
    assert len(done) >= 10
    for b in done:
        c = TrainingConfig.from_dict(b["config"])
        est = estimate(proxy.model, c, b["gpus"])
        rel = 0.15 if c.overlap_ep_a2a else 0.10
        assert est.model_state_gb + est.activations_gb == pytest.approx(b["peak_memory_gb"], rel=rel), b["name"]
    picked = {b["name"]: b for b in done}
    base = TrainingConfig.from_dict(picked["baseline"]["config"])
    a1 = estimate(proxy.model, base, 2).activations_gb
    a2 = estimate(proxy.model, base.replace(seq_length=4096), 2).activations_gb
    te = estimate(proxy.model, base.replace(transformer_impl="transformer_engine", seq_length=4096), 2)
    assert a2 > 2.5 * a1 and te.activations_gb < 2.2 * a1


# Layouts where Megatron's activation formula applies as written (its SP formula needs SP with
# selective recompute; its no-SP formula assumes no SP), two per model.
SCOPE_LAYOUTS = [
    ("qwen3_235b", {"tp": 4, "ep": 64, "recompute_granularity": "selective", "recompute_modules": ("core_attn",)}),
    ("qwen3_235b", {}),
    ("qwen3_30b_a3b", {}),
    ("qwen3_30b_a3b", {"tp": 2, "sequence_parallel": True, "ep": 8, "pp": 2}),
    ("deepseek_v3", {}),
    ("deepseek_v3", {"tp": 4, "ep": 32}),
    ("mixtral_8x7b", {}),
    ("mixtral_8x7b", {"tp": 2, "sequence_parallel": True, "pp": 2}),
    ("mixtral_8x22b", {"recompute_granularity": "selective", "recompute_modules": ("core_attn",)}),
    ("mixtral_8x22b", {"tp": 4, "pp": 4, "recompute_granularity": "selective", "recompute_modules": ("core_attn",)}),
]


@pytest.mark.megatron
@pytest.mark.skipif(not mv.available(), reason="no .venv-megatron (scripts/megatron-venv)")
def test_dense_scope_total_within_10_percent_of_megatron():
    exps = {n: load_experiment(n) for n, _ in SCOPE_LAYOUTS}
    cfgs = [(exps[n], exps[n].baseline.replace(**ch)) for n, ch in SCOPE_LAYOUTS]
    theirs = mv.theoretical_memory([c.to_args(e.model) + run_args() for e, c in cfgs],
                                   [e.cluster.gpus for e, _ in cfgs])
    for (name, changes), (e, c), t in zip(SCOPE_LAYOUTS, cfgs, theirs):
        assert isinstance(t, list), (name, t)
        ours = estimate(e.model, c, e.cluster.gpus, routing=False)
        # Megatron's formula takes the attention's width to be the hidden size; where the query is
        # wider (Qwen3: 64 heads of 128 on a hidden size of 4096), ours counts the wider Q and
        # output that core_attn recompute keeps (the checkpoint's inputs, the projection's input)
        wide = e.model.num_attention_heads * (e.model.kv_channels or 0) > e.model.hidden_size
        rel = 0.12 if wide and "core_attn" in c.recompute_modules else 0.10
        assert ours.model_state_gb + ours.activations_gb == pytest.approx(t[2] / 1024, rel=rel), (name, changes)


def test_plan_cli_errors(capsys):
    from moetune.pipeline.cli.plan import main
    assert main(["mixtral_8x7b", "--gpus", "12"]) == 2  # 1.5 nodes of 8
    assert "multiple of 8" in capsys.readouterr().err
    assert main(["no_such_model"]) == 2
    assert "known: " in capsys.readouterr().err
    assert main(["deepseek_v3", "--gpus", "8"]) == 1
    assert "no layout of deepseek_v3 fits" in capsys.readouterr().out
    assert main(["mixtral_8x7b", "--gpus", "16", "--limit", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("mixtral_8x7b on 16x H100") and len(lines) == 4
