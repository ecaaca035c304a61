"""estimate/flops.py: a layer's FLOPs by kind and their time on the GPU table's rates, against
hand computations on a small made-up model."""
import pytest

from moetune.experiment.config import TrainingConfig
from moetune.experiment.model import ModelArch
from moetune.estimate import Rates
from moetune.estimate import flops

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


def test_fp8_gemms_take_the_measured_factor_of_their_bf16_time():
    """FP8 prices GEMMs at their BF16 time x fp8_matrix_time_factor (1.1228, measured with the
    casts), not at the data sheet's FP8 peak; attention and element-wise kernels stay as they were;
    a GEMM's BF16 time is its FLOPs over the peak x its size's efficiency."""
    r, c = Rates(), TrainingConfig(micro_batch=2)
    w = flops.stage_work(TOY, c, r)[0]
    bf16 = flops.compute_ms(w, c, "H100", r)
    fp8 = flops.compute_ms(w, c.replace(fp8_format="e4m3", fp8_recipe="tensorwise"), "H100", r)
    assert fp8["gemm"] == pytest.approx(1.1228 * bf16["gemm"])
    assert fp8["grouped_gemm"] == pytest.approx(1.1228 * bf16["grouped_gemm"])
    assert (fp8["attention"], fp8["elementwise"]) == (bf16["attention"], bf16["elementwise"])
    # the experts' time itself: eight experts a rank (EP 1), each a gate-and-up GEMM (2/3 of the
    # FLOPs) and a down GEMM (1/3), each at its size's share of the BF16 peak
    f = flops.layer_flops(TOY, c, moe=True)["experts"]
    eff = lambda x: 0.969 * x / (x + 19.429e9)  # noqa: E731
    want = w.flops["experts"] * (2 / 3 / eff(f * 2 / 3 / 8) + 1 / 3 / eff(f / 3 / 8)) / 989e12
    assert bf16["grouped_gemm"] == pytest.approx(1e3 * want)


def test_gemm_efficiency_grows_with_size():
    """flops.gemm_efficiency: half of the top at the half size, near the top far above it; the
    experts' calls shrink as EP spreads them (EP 4: two experts a rank, each with a quarter of the
    layer's expert FLOPs)."""
    assert flops.gemm_efficiency(19.429e9, 0.969, 19.429) == pytest.approx(0.969 / 2)
    assert flops.gemm_efficiency(1e15, 0.969, 19.429) == pytest.approx(0.969, rel=1e-4)
    c = TrainingConfig(micro_batch=2, ep=4)
    f = flops.layer_flops(TOY, c, moe=True)["experts"]
    assert flops.gemm_calls(TOY, c)["experts"] == ((2 / 3, f * 2 / 3 / 2), (1 / 3, f / 3 / 2))


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
