"""estimate/flops.py: a layer's FLOPs by kind and their time on the GPU table's rates, against
hand computations on a small made-up model."""
import pytest

from moetune.experiment.config import TrainingConfig
from moetune.experiment.model import ModelArch
from moetune.estimate import Rates
from moetune.estimate import flops, kernels

TOY = ModelArch(name="toy", num_layers=8, hidden_size=1024, num_attention_heads=8, num_query_groups=8,
                ffn_hidden_size=4096, moe_ffn_hidden_size=512, num_experts=8, moe_router_topk=2,
                vocab_size=32000, seq_length=1024)


def test_moe_layer_flops():
    """2048 tokens (micro batch 2 of 1024), hidden 1024, 8 heads of 128: attention projections
    2 x T x 4 x 1024^2 (q, k, v, out with 8 query groups); causal core attention half of
    2 x T x S x heads x 256; experts 2 x T x top-2 x 3 x 1024 x 512; router 2 x T x 1024 x 8."""
    t = 2048
    f = flops.layer_flops(TOY, TrainingConfig(micro_batch=2), moe=True)
    assert f["attention_proj"] == 2 * t * 4 * 1024 ** 2
    assert f["attention_core"] == 2 * t * 1024 * 8 * 256 * 0.5
    assert f["experts"] == 2 * t * 2 * 3 * 1024 * 512
    assert f["router"] == 2 * t * 1024 * 8 and f["shared_experts"] == 0


def test_fp8_gemms_are_priced_from_their_recipes_layer_rows():
    """FP8 prices each GEMM from the kernel table's TE layer rows of its recipe (casts and scaling
    in), not from a factor on BF16: tensorwise and blockwise differ as their rows do; attention and
    element-wise kernels stay as they were; the experts as one grouped layer of the rank's experts
    where --moe-grouped-gemm is on, as separate layers where it is off."""
    r, c = Rates(), TrainingConfig(micro_batch=2, grouped_gemm=True)
    table = kernels.table_for("H100")
    w = flops.stage_work(TOY, c, r)[0]
    bf16 = flops.compute_ms(w, c, "H100", r, table)
    tw = flops.compute_ms(w, c.replace(fp8_format="e4m3", fp8_recipe="tensorwise"), "H100", r, table)
    bw = flops.compute_ms(w, c.replace(fp8_format="e4m3", fp8_recipe="blockwise"), "H100", r, table)
    assert (tw["attention"], tw["elementwise"]) == (bf16["attention"], bf16["elementwise"])
    assert tw["grouped_gemm"] != bw["grouped_gemm"] and tw["grouped_gemm"] != bf16["grouped_gemm"]
    # the experts' time itself: 8 experts a rank (EP 1), 512 tokens each (2048 x top-2 / 8); the
    # gate-and-up layer [512 x 8, 1024] @ [1024, 1024], then the down one [512 x 8, 512] @ [512, 1024]
    want = sum(table.layer_us(512, k, n, 8, "tensorwise") for k, n in ((1024, 1024), (512, 1024)))
    assert tw["grouped_gemm"] == pytest.approx(TOY.num_layers * want / 1e3)
    apart = flops.compute_ms(w, c.replace(grouped_gemm=False, fp8_format="e4m3", fp8_recipe="tensorwise"),
                             "H100", r, table)
    one = sum(table.layer_us(512, k, n, 1, "tensorwise") for k, n in ((1024, 1024), (512, 1024)))
    assert apart["grouped_gemm"] == pytest.approx(TOY.num_layers * 8 * one / 1e3)


def test_the_kernel_table_rate_moves_gemms_and_attention_only():
    """kernel_table_rate (a cluster's GEMM sweep over the reference's) divides the table's times;
    element-wise kernels keep theirs."""
    c, table = TrainingConfig(micro_batch=2), kernels.table_for("H100")
    w = flops.stage_work(TOY, c, Rates())[0]
    a = flops.compute_ms(w, c, "H100", Rates(), table)
    b = flops.compute_ms(w, c, "H100", Rates(measured={"kernel_table_rate": (2.0, "x")}), table)
    for k in ("gemm", "grouped_gemm", "attention"):
        assert b[k] == pytest.approx(a[k] / 2), k
    assert b["elementwise"] == a["elementwise"]


def test_recompute_runs_forward_again():
    """Recomputing `moe` adds the experts' and router's forward FLOPs once more a layer; full
    recompute adds the whole forward."""
    c = TrainingConfig(micro_batch=2)
    f = flops.layer_flops(TOY, c, moe=True)
    moe = c.replace(recompute_granularity="selective", recompute_modules=("moe",))
    assert flops.recomputed_flops(TOY, moe, f) == f["experts"] + f["router"]
    assert flops.recomputed_flops(TOY, c.replace(recompute_granularity="full"), f) == sum(f.values())


def test_sliding_window_cuts_core_attention_on_its_layers_only():
    """A 128-key window on every other layer of a 1024-token sequence: those layers' queries
    attend (128·129/2 + 896·128)/1024 keys on average, the full layers half the sequence; the
    core attention FLOPs follow the layers' mean, the projections do not change."""
    swa = ModelArch(**{**TOY.to_dict(), "window_size": 128, "window_attn_skip_freq": 2})
    window = (128 * 129 / 2 + 896 * 128) / 1024
    assert flops.attended_keys(swa, 1024) == pytest.approx((512 + window) / 2)
    full, cut = (flops.layer_flops(m, TrainingConfig(), moe=True) for m in (TOY, swa))
    assert cut["attention_core"] == pytest.approx(full["attention_core"] * (512 + window) / 2 / 512)
    assert cut["attention_proj"] == full["attention_proj"] and cut["experts"] == full["experts"]
    # a window as long as the sequence is no window
    assert flops.attended_keys(ModelArch(**{**swa.to_dict(), "window_size": 4096}), 1024) == 512


def test_recompute_moves_its_modules_forward_bytes_and_launches_again():
    """Recompute reruns its modules' forward: their element-wise bytes once more (moe_act: SwiGLU's
    two inputs and output of the top-k copies; layernorm: the two norms' reads and writes; full: the
    layer's forward, a third of forward and backward) and their launches (moe_act under grouped GEMM
    one kernel; layernorm two), so the stage's work grows by exactly those."""
    r = Rates()
    c = TrainingConfig(micro_batch=2, grouped_gemm=True)
    t, h, k, f = 2048, 1024, 2, 512
    sel = c.replace(recompute_granularity="selective", recompute_modules=("moe_act", "layernorm"))
    assert flops.recomputed_bytes(TOY, sel, moe=True) == flops.BF16 * t * (2 * 2 * h + 3 * k * f)
    assert flops.recomputed_bytes(TOY, sel, moe=False) == flops.BF16 * t * 2 * 2 * h
    full = c.replace(recompute_granularity="full")
    assert flops.recomputed_bytes(TOY, full, moe=True) == pytest.approx(flops.layer_bytes(TOY, c, True) / 3)
    assert flops.recomputed_launches(TOY, sel, True, 8, r) == 3
    base, again = flops.stage_work(TOY, c, r)[0], flops.stage_work(TOY, sel, r)[0]
    assert again.bytes - base.bytes == pytest.approx(TOY.num_layers * flops.recomputed_bytes(TOY, sel, True))
    assert again.kernels - base.kernels == pytest.approx(TOY.num_layers * 3)
    none = c.replace(recompute_granularity=None)
    assert flops.recomputed_bytes(TOY, none, True) == flops.recomputed_launches(TOY, none, True, 8, r) == 0


def test_moe_recompute_launches_against_moetunes_measured_pair():
    """A selective `moe` recompute's launches, priced as the forward third of the layer's expert
    launches, against the one-GPU pair of the trial bank that differs by it alone (baseline_1gpu,
    recompute_moe_1gpu: 16 local experts, no grouped GEMM, 4 layers, 8 micro-batches a step):
    within 10 % of the launches a layer and micro-batch it measured."""
    import json
    from pathlib import Path
    bank = Path(__file__).resolve().parents[2] / "data" / "trial_bank" / "bank.jsonl"
    rows = {r["name"]: r for r in map(json.loads, bank.read_text().splitlines())}
    base, rec = rows["baseline_1gpu"], rows["recompute_moe_1gpu"]
    assert rec["config"]["recompute_modules"] == ["moe"] and base["config"]["ep"] == 1
    per = lambda r: r["analysis"]["metrics"]["combined"]["kernels_per_step"]  # noqa: E731
    layers, mb = 4, 8  # the bank's moe_proxy, global batch 16 at micro batch 2 on one GPU
    assert base["args"][base["args"].index("--num-layers") + 1] == str(layers)
    measured = (per(rec) - per(base)) / (layers * mb)
    c = TrainingConfig(recompute_granularity="selective", recompute_modules=("moe",))
    assert flops.recomputed_launches(TOY, c, True, 16, Rates()) == pytest.approx(measured, rel=0.1)


def test_recomputed_attention_runs_at_attentions_forward_rate():
    """core_attn recompute adds the attention forward's time at its shape's measured forward rate,
    not at the GEMMs' mean rate: the stage's attention time grows by exactly one forward per layer
    and its GEMM time not at all."""
    r, table = Rates(), kernels.table_for("H100")
    c = TrainingConfig(micro_batch=2, grouped_gemm=True)
    rc = c.replace(recompute_granularity="selective", recompute_modules=("core_attn",))
    base, again = (flops.stage_work(TOY, x, r)[0] for x in (c, rc))
    a, b = flops.table_ms(base, c, table), flops.table_ms(again, rc, table)
    fwd, _ = table.attention_us(again.attention)
    assert b["gemm"] == a["gemm"] and b["grouped_gemm"] == a["grouped_gemm"]
    assert b["attention"] - a["attention"] == pytest.approx(TOY.num_layers * fwd / 1e3 * (
        flops.layer_flops(TOY, c, True)["attention_core"] / again.attention.forward_flop()))
