"""estimate/memory.py, the memory estimate: published parameter counts, what each knob saves, the
plan's order, agreement with Megatron's own theoretical figure on weights and optimizer states, and
the estimate against measured peaks: moe_proxy's trial bank runs, and every measured rank of the fit
lease's ten production layouts (on one H200, megatron-core 0.19.2 `--fake-process-group`, TE 2.20.2;
benchmarks/fit_lease/, docs/memory.md), with activations counted from the architecture, no scale."""
import json
import re
from pathlib import Path

import pytest

from moetune.experiment import megatron_validate as mv
from moetune.analysis.logs import parse_log, read_log_text
from moetune.estimate import memory
from moetune.experiment.config import TrainingConfig, run_args
from moetune.experiment.schema import load_experiment
from moetune.estimate.memory import count_params, estimate, mtp_params, plan

PUBLISHED_B = {"qwen3_235b": 235, "qwen3_30b_a3b": 30.5, "mixtral_8x7b": 46.7, "mixtral_8x22b": 141,
               "deepseek_v3": 671 + 14}  # DeepSeek-V3: 671 B main model + 14 B MTP module


@pytest.mark.parametrize("name, billions", PUBLISHED_B.items())
def test_parameter_counts_match_published(name, billions):
    """Each model's parameter count (MTP included) is within 2% of its published size."""
    m = load_experiment(name).model
    total = (count_params(m).total + mtp_params(m).total) / 1e9
    assert total == pytest.approx(billions, rel=0.02)


def test_knobs_move_the_estimate_the_right_way():
    """Each memory knob moves the estimate the way it should: distributed optimizer, recompute, offload,
    micro batch, EP."""
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


def test_fsdp_model_state_falls_with_data_parallel_where_the_distributed_optimizers_weights_do_not():
    """Under Megatron FSDP weights and gradients are sharded: doubling the GPUs (the data-parallel
    group) shrinks them towards the two whole layers it holds, where the distributed optimizer keeps
    every weight and gradient on every rank; the optimizer states shrink alike under both."""
    e = load_experiment("qwen3_235b")
    c = e.baseline.replace(tp=1, pp=1, vpp=None, ep=8, etp=1, sequence_parallel=False, account_for_embedding=False,
                           account_for_loss=False, micro_batch=4, global_batch=8192, recompute_granularity="full",
                           recompute_modules=(), recompute_num_layers=1)
    dist = [estimate(e.model, c, g) for g in (128, 256, 512)]
    fsdp = [estimate(e.model, c.replace(fsdp=True), g) for g in (128, 256, 512)]
    assert dist[0].weights_gb == dist[2].weights_gb and dist[0].grads_gb == dist[2].grads_gb
    assert fsdp[0].weights_gb > fsdp[1].weights_gb > fsdp[2].weights_gb
    assert fsdp[0].grads_gb > fsdp[1].grads_gb > fsdp[2].grads_gb
    assert [f.optimizer_gb for f in fsdp] == pytest.approx([d.optimizer_gb for d in dist])
    assert [f.activations_gb for f in fsdp] == [d.activations_gb for d in dist]
    # NVIDIA's layout: 235B parameters over 256 H100 fit where the distributed optimizer's cannot
    assert fsdp[1].total_gb < 0.9 * 80 < dist[1].total_gb
    assert any("FSDP" in n for n in fsdp[1].notes)

def test_plan_least_model_parallel_first(capsys):
    """plan lists distinct fitting layouts least model parallelism first, recompute only where needed;
    the command prints them as JSON."""
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
    from moetune.cli.main import main
    assert main(["plan", "mixtral_8x7b", "--gpus", "64", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)["layouts"]
    assert out and {"args", "memory_gb"} <= set(out[0]) and "--expert-model-parallel-size" in out[0]["args"]


def test_plan_refuses_what_cannot_fit():
    """No layout of DeepSeek-V3 fits one H100 node."""
    e = load_experiment("deepseek_v3")
    assert plan(e, gpus=8) == []  # 685 B parameters do not fit on one H100 node


@pytest.mark.megatron
@pytest.mark.skipif(not mv.available(), reason="no .venv-megatron (scripts/megatron-venv)")
def test_model_state_within_10_percent_of_megatron():
    """The model-state estimate is within 10% of Megatron's theoretical figure for each baseline but
    DeepSeek-V3's."""
    # deepseek_v3's baseline is left out on purpose since the fit-lease calibration: its first stage
    # holds 3 dense layers (--decoder-first-pipeline-num-layers 3), which Megatron's figure prices
    # as an even share of MoE layers plus MTP (20.0 GB); the measured model state on that rank is
    # 8.1 GB and ours 8.1 GB (the fit lease tests below)
    names = [n for n in PUBLISHED_B if n != "deepseek_v3"]
    exps = [load_experiment(n) for n in names]
    exps = [e.model_copy(update={"baseline": e.baseline.replace(**OLD_QWEN)}) if e.name == "qwen3_235b" else e
            for e in exps]
    theirs = mv.theoretical_memory([e.baseline.to_args(e.model) + run_args() for e in exps],
                                   [e.cluster.gpus for e in exps])
    for n, e, t in zip(names, exps, theirs):
        ours = estimate(e.model, e.baseline, e.cluster.gpus, stage=0).model_state_gb  # Megatron's: rank 0
        assert ours == pytest.approx(t[0] / 1024, rel=0.10), n


def test_estimate_within_10_percent_of_measured_peak():
    """Real GPU runs (trial bank: moe_proxy on 1-2x H200, local attention, Megatron's max allocated):
    the MoE-aware estimate without the fixed overhead lands within 10 % of the measured peak, 15 %
    where the EP all-to-all overlap adds its buffers (not modelled), and the unfused attention's
    score matrix is what makes longer sequences cost more than linearly."""
    from moetune.experiment.config import TrainingConfig
    from moetune.paths import ROOT as REPO
    bank = [json.loads(line) for line in (REPO / "data/trial_bank/bank.jsonl").read_text().splitlines()
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
# qwen3_235b's former baseline, TP2 PP2 EP32, evenly split, no recompute: Megatron's formula takes
# neither virtual stages with the embedding and loss accounted nor moetune's uneven split
OLD_QWEN = {"pp": 2, "vpp": None, "account_for_embedding": False, "account_for_loss": False,
            "recompute_granularity": None, "recompute_modules": ()}
SCOPE_LAYOUTS = [
    ("qwen3_235b", {**OLD_QWEN, "tp": 4, "ep": 64, "recompute_granularity": "selective",
                    "recompute_modules": ("core_attn",)}),
    ("qwen3_235b", OLD_QWEN),
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
    """Model state plus activations is within 10% of Megatron's theoretical total on each layout (12%
    for wide-query core_attn recompute)."""
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
    """`moetune plan`: a --gpus that splits a node or an unknown model exits 2 with one line; nothing
    fitting exits 1; a limit bounds the list."""
    from moetune.cli.plan import main
    assert main(["mixtral_8x7b", "--gpus", "12"]) == 2  # 1.5 nodes of 8
    assert "multiple of 8" in capsys.readouterr().err
    assert main(["no_such_model"]) == 2
    assert "known: " in capsys.readouterr().err
    assert main(["deepseek_v3", "--gpus", "8"]) == 1
    assert "no layout of deepseek_v3 fits" in capsys.readouterr().out
    assert main(["mixtral_8x7b", "--gpus", "16", "--limit", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # the header, the search's two lines of counts, the columns, the two rows the limit shows and how
    # many of them lie inside the first's band
    assert lines[0].startswith("mixtral_8x7b on 16x H100") and len(lines) == 7
    assert lines[1].startswith("searched ") and len([ln for ln in lines[4:6] if ln.split()[0].isdigit()]) == 2
    assert "of the 2 shown lie inside the first's band" in lines[6]


FIT = Path(__file__).resolve().parents[2] / "benchmarks" / "fit_lease"
ALL_RANKS = json.loads((FIT / "layouts.json").read_text())
LAYOUTS = [l for l in ALL_RANKS if l["rank"] == 0]
STATE = re.compile(r"\(after 2 iterations\) memory \(MB\) \| allocated: ([\d.]+)")


def _measured(name):
    log = FIT / "logs" / f"{name}.log.xz"
    state_mb = float(STATE.search(read_log_text(log)).group(1))  # after the step: weights, grads, optimizer
    return parse_log(log)["max_allocated_gb"], state_mb / 1024


def test_ten_layouts_five_models():
    """The fit lease holds rank 0 of ten layouts of the five production models."""
    assert len(LAYOUTS) == 10 and len({l["model"] for l in LAYOUTS}) == 5


@pytest.mark.parametrize("lay", ALL_RANKS, ids=lambda l: l["name"])
def test_fit_lease_estimate_within_5_percent_of_measured_peak(lay):
    """Every measured rank (rank 0 and each last stage's first rank), with the activations counted
    tensor by tensor and no fitted scale: within 5 % of its measured peak, and the model state
    alone within 10 % of the measured one."""
    exp = load_experiment(lay["model"])
    cfg = TrainingConfig.from_dict(lay["config"])
    stage = 0 if lay["rank"] == 0 else cfg.pp - 1
    est = estimate(exp.model, cfg, lay["world_size"], stage=stage)
    peak, state = _measured(lay["name"])
    assert est.model_state_gb + est.activations_gb == pytest.approx(peak, rel=0.05)
    assert est.model_state_gb == pytest.approx(state, rel=0.10)  # the model state alone, too


def test_mtp_stage_builds_its_own_input_embedding():
    """DeepSeek-V3's MTP layer sits on the last stage, which then builds the input embedding as
    well (the next tokens' embeddings): its weights grow by the embedding's share of a TP rank
    and the MTP layer's, and at PP 1 the one embedding the first stage has serves both."""
    e = load_experiment("deepseek_v3")
    m, c, gpus = e.model, e.baseline, e.cluster.gpus
    bare = type(m)(**{**m.to_dict(), "mtp_num_layers": 0})
    last = c.pp - 1
    grown = estimate(m, c, gpus, stage=last).weights_gb - estimate(bare, c, gpus, stage=last).weights_gb
    mtp = mtp_params(m)
    per_rank = (mtp.dense + count_params(m, c.tp).embedding) / c.tp + mtp.replicated + mtp.experts / c.ep
    assert grown * memory.GB == pytest.approx(2 * per_rank)
    one = c.replace(pp=1, first_pp_layers=None, last_pp_layers=None)
    grown1 = estimate(m, one, gpus, stage=0).weights_gb - estimate(bare, one, gpus, stage=0).weights_gb
    assert grown1 * memory.GB == pytest.approx(2 * (mtp.dense / c.tp + mtp.replicated + mtp.experts / c.ep))


def test_no_fitted_activation_scale():
    """The activations carry no per-family factor: two models that differ only in name estimate the same."""
    exp = load_experiment("qwen3_30b_a3b")
    renamed = type(exp.model)(**{**exp.model.to_dict(), "name": "unseen_family"})
    assert not hasattr(memory, "ACTIVATION_SCALE")
    assert estimate(renamed, exp.baseline, 16).activations_gb == estimate(exp.model, exp.baseline, 16).activations_gb


def test_biases_and_sinks_add_their_parameters():
    """add_bias_linear: per layer the QKV and output biases (d·(heads + 2·groups) + h) and each
    gated MLP's fc1 and fc2 biases (2·ffn + h, each expert); learnable softmax: one sink a head."""
    from moetune.experiment.model import ModelArch
    m = ModelArch("b", 4, 256, 8, 2, 512, 128, 4, 2, 1000, 64)
    biased = ModelArch(**{**m.to_dict(), "add_bias_linear": True, "softmax_type": "learnable"})
    p, q = count_params(m), count_params(biased)
    d = 256 // 8
    assert q.dense - p.dense == 4 * (d * (8 + 4) + 256 + 8)
    assert q.experts - p.experts == 4 * 4 * (2 * 128 + 256)
    assert q.embedding == p.embedding and q.replicated == p.replicated
