"""One pipeline stage's work for one micro-batch on one rank: matrix FLOPs by kind, bytes that
element-wise kernels move, and kernels launched; then its time on a GPU of the table.

Forward FLOPs are 2 per multiply-add; backward is twice the forward; recomputed modules run their
forward again: its FLOPs, its element-wise bytes and its launches. Routing is taken as balanced:
every rank's experts get top-k times its tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from moetune.estimate import kernels as ktable
from moetune.estimate.memory import attention_params, padded_vocab
from moetune.estimate.rates import Rates
from moetune.experiment import gpus
from moetune.experiment.config import TrainingConfig
from moetune.experiment.fit import pipeline_stages
from moetune.experiment.model import ModelArch

BF16 = 2  # bytes an activation element takes
CAUSAL = 0.5  # a causal mask computes half the score matrix


def tokens(m: ModelArch, c: TrainingConfig) -> float:
    """Tokens of one micro-batch on one rank's share of the sequence (context parallel splits it)."""
    return (c.seq_length or m.seq_length) * c.micro_batch / c.cp


def mla_up_params(m: ModelArch) -> float:
    """MLA's up-projections (latent to per-head queries, keys and values): what `mla_up_proj`
    recompute runs again."""
    if not m.multi_latent_attention:
        return 0.0
    heads = m.num_attention_heads
    q = (m.q_lora_rank or 0) * heads * (m.qk_head_dim + m.qk_pos_emb_head_dim)
    return q + m.kv_lora_rank * heads * (m.qk_head_dim + m.v_head_dim)


def attended_keys(m: ModelArch, s: int) -> float:
    """Keys a query attends on average over the model's layers: half the sequence under a causal
    mask, at most the window on a sliding-window layer (the first `window` queries see fewer)."""
    full = s * CAUSAL
    windowed = m.window_layers()
    if not windowed or m.window_size is None or m.window_size >= s:
        return full
    w = m.window_size
    window = (w * (w + 1) / 2 + (s - w) * w) / s
    return ((m.num_layers - windowed) * full + windowed * window) / m.num_layers


def layer_flops(m: ModelArch, c: TrainingConfig, moe: bool) -> dict[str, float]:
    """Forward FLOPs of one decoder layer for one micro-batch on one rank, by kind."""
    t, h, tp = tokens(m, c), m.hidden_size, c.tp
    s = c.seq_length or m.seq_length
    if m.multi_latent_attention:
        head_dims = m.qk_head_dim + m.qk_pos_emb_head_dim + m.v_head_dim
    else:
        head_dims = 2 * (m.kv_channels or h // m.num_attention_heads)
    out = {"attention_proj": 2 * t * attention_params(m) / tp,
           "attention_core": 2 * t * attended_keys(m, s) * m.num_attention_heads * head_dims / tp}
    if moe:
        out["experts"] = 2 * t * m.moe_router_topk * 3 * h * m.moe_ffn_hidden_size / tp
        out["shared_experts"] = 2 * t * 3 * h * (m.moe_shared_expert_intermediate_size or 0) / tp
        out["router"] = 2 * t * h * m.num_experts / tp
    else:
        out["dense_mlp"] = 2 * t * 3 * h * m.ffn_hidden_size / tp
    return out


def recomputed_flops(m: ModelArch, c: TrainingConfig, f: dict[str, float]) -> float:
    """Forward FLOPs a layer runs again in backward under the config's recompute."""
    if c.recompute_granularity == "full":
        return sum(f.values())
    mods = set(c.selective_modules)
    again = {"core_attn": ("attention_core",), "mlp": ("dense_mlp",),
             "moe": ("experts", "router", "shared_experts"), "shared_experts": ("shared_experts",)}
    extra = sum(f.get(k, 0.0) for k in {k for mod in mods for k in again.get(mod, ())})
    if "mla_up_proj" in mods:
        extra += 2 * tokens(m, c) * mla_up_params(m) / c.tp
    return extra


def reruns_moe_forward(c: TrainingConfig) -> bool:
    """Recompute runs a MoE layer's forward again whole, its dispatch and combine included: full
    recompute, or selective `moe` (Megatron checkpoints the layer's forward, all-to-all and all)."""
    return c.recompute_granularity == "full" or "moe" in c.selective_modules


def reruns_attention(c: TrainingConfig) -> bool:
    """Recompute runs core attention's forward again (its ring too under context parallel): full
    recompute, or selective `core_attn`."""
    return c.recompute_granularity == "full" or "core_attn" in c.selective_modules


def recomputed_bytes(m: ModelArch, c: TrainingConfig, moe: bool) -> float:
    """Bytes the element-wise kernels of a layer's recomputed modules move again in backward: their
    forward's (layer_bytes' items, once)."""
    if c.recompute_granularity == "full":
        return layer_bytes(m, c, moe) / 3
    mods = set(c.selective_modules)
    h, k = m.hidden_size, m.moe_router_topk
    shared = 3 * (m.moe_shared_expert_intermediate_size or 0)
    per_token = 2 * 2 * h if "layernorm" in mods else 0  # the two norms: read, write
    if moe and "moe" in mods:
        per_token += 3 * k * m.moe_ffn_hidden_size + 4 * k * h + 2 * m.num_experts * 2 + shared
    elif moe:
        per_token += (3 * k * m.moe_ffn_hidden_size if "moe_act" in mods else 0) + \
            (shared if "shared_experts" in mods else 0)
    elif "mlp" in mods:
        per_token += 3 * m.ffn_hidden_size
    return BF16 * per_token * tokens(m, c) / c.tp


def recomputed_launches(m: ModelArch, c: TrainingConfig, moe: bool, local: int, rates: Rates) -> float:
    """Kernels a layer's recompute launches again in backward: the forward's of what it reruns. A
    pass's launches are taken as its FLOPs' share, a third forward (so a selective `moe` recompute
    of 16 local experts adds 34, against 35 measured: data/trial_bank, recompute_moe_1gpu over
    baseline_1gpu); a module of single kernels, its own count (moe_act: one grouped activation, or
    one an expert without grouped GEMM, +1 measured: te_gg_recompute_act over te_gg). The MoE
    layer's own launches outside its experts (router, permutation) sit in kernels_per_layer with
    attention's, not apart: `moe` counts its experts' only, measured where those dominate."""
    experts = rates["kernels_per_local_expert"] * local if moe else 0.0
    if c.recompute_granularity == "full":
        return (rates["kernels_per_layer"] + experts) / 3
    mods = set(c.selective_modules)
    n = 2.0 if "layernorm" in mods else 0.0
    n += 1 if "core_attn" in mods else 0  # the fused attention kernel
    n += 2 if "mla_up_proj" in mods and m.multi_latent_attention else 0  # query and key-value up
    if moe and "moe" in mods:
        n += experts / 3
    elif moe:
        n += (1 if c.grouped_gemm else local) if "moe_act" in mods else 0
        n += 3 if "shared_experts" in mods and m.moe_shared_expert_intermediate_size else 0  # fc1, act, fc2
    elif "mlp" in mods:
        n += 3
    return n


def layer_bytes(m: ModelArch, c: TrainingConfig, moe: bool) -> float:
    """Bytes the element-wise kernels of one layer move, forward and backward (backward taken as
    twice the forward): norms, residual adds, activation, token permutation, router scores.
    Sequence parallel splits them by TP."""
    h = m.hidden_size
    per_token = 2 * 2 * h + 2 * 3 * h  # two norms (read, write), two residual adds (two reads, a write)
    if moe:
        k = m.moe_router_topk
        per_token += 3 * k * m.moe_ffn_hidden_size  # SwiGLU: two in, one out
        per_token += 4 * k * h  # permute and unpermute, each a read and a write of k copies
        per_token += 3 * (m.moe_shared_expert_intermediate_size or 0)
        per_token += 2 * m.num_experts * 2  # router scores (fp32) written and read
    else:
        per_token += 3 * m.ffn_hidden_size
    return 3 * BF16 * per_token * tokens(m, c) / c.tp


def output_flops(m: ModelArch, c: TrainingConfig) -> float:
    return 2 * tokens(m, c) * m.hidden_size * padded_vocab(m, c.tp) / c.tp


@dataclass
class StageWork:
    """One stage's work for one micro-batch on one of its ranks."""
    index: int
    layers: int
    moe_layers: int
    flops: dict[str, float] = field(default_factory=dict)  # forward + backward + recompute, by kind
    bytes: float = 0.0
    kernels: float = 0.0
    grad_adds: float = 0.0  # of `kernels`: the weight-gradient adds gradient-accumulation fusion removes
    shapes: list = field(default_factory=list)  # (kernels.Gemm, layers that run it) of one micro-batch
    attention: ktable.Attention | None = None  # one layer's attention shape

    def to_dict(self) -> dict:
        return {"index": self.index, "layers": self.layers, "moe_layers": self.moe_layers,
                "tflop": {k: round(v / 1e12, 4) for k, v in self.flops.items()},
                "elementwise_gb": round(self.bytes / 1e9, 4), "kernels": round(self.kernels),
                "grad_adds": round(self.grad_adds)}


def attention_weights(m: ModelArch) -> int:
    """TE linear weights of one attention block: QKV and output, or MLA's projections (the query's
    down and up where it has a low rank, else one; the key-value's down and up; the output)."""
    if m.multi_latent_attention:
        return (2 if m.q_lora_rank else 1) + 3
    return 2


def stage_work(m: ModelArch, c: TrainingConfig, rates: Rates) -> list[StageWork]:
    """Each pipeline stage's work for one micro-batch (its layers over all its virtual stages; the
    last stage holds the output layer, the loss and the MTP layers, each MTP layer with its own
    output layer)."""
    out = []
    stages = pipeline_stages(m, c)
    for st in stages:
        w = StageWork(st.index, st.layers, st.moe_layers)
        for moe, n in ((False, st.layers - st.moe_layers), (True, st.moe_layers)):
            if not n:
                continue
            f = layer_flops(m, c, moe)
            for kind, v in f.items():
                w.flops[kind] = w.flops.get(kind, 0.0) + 3 * n * v
            # recomputed attention runs at attention's forward rate, the rest at the GEMMs'
            attn = f["attention_core"] if reruns_attention(c) else 0.0
            w.flops["recompute"] = w.flops.get("recompute", 0.0) + n * (recomputed_flops(m, c, f) - attn)
            w.flops["recompute_attention"] = w.flops.get("recompute_attention", 0.0) + n * attn
            w.bytes += n * (layer_bytes(m, c, moe) + recomputed_bytes(m, c, moe))
            w.shapes += [(g, n) for g in ktable.layer_gemms(m, c, moe)]
        if st.index == len(stages) - 1:
            heads = 1 + m.mtp_num_layers
            w.flops["output"] = 3 * heads * output_flops(m, c)
            w.bytes += heads * 3 * 4 * tokens(m, c) * padded_vocab(m, c.tp) / c.tp  # fp32 logits for the loss
            w.shapes.append((ktable.output_gemm(m, c, padded_vocab(m, c.tp)), heads))
        w.attention = ktable.attention_shape(m, c)
        local = max(1, m.num_experts // max(c.ep, 1)) if m.num_experts > 1 else 0
        w.kernels = rates["kernels_per_layer"] * st.layers + rates["kernels_per_local_expert"] * local * st.moe_layers
        w.kernels += (recomputed_launches(m, c, True, local, rates) * st.moe_layers
                      + recomputed_launches(m, c, False, local, rates) * (st.layers - st.moe_layers))
        if c.permute_fusion:
            w.kernels -= rates["permute_fusion_launches_removed"] * st.moe_layers
        w.grad_adds = (st.layers * (attention_weights(m) + (2 if m.moe_shared_expert_intermediate_size else 0))
                       + (st.layers - st.moe_layers) * 2 + st.moe_layers * 2 * local)
        out.append(w)
    return out


ATTENTION = ("attention_core",)


def table_ms(w: StageWork, c: TrainingConfig, table: ktable.KernelTable) -> dict[str, float]:
    """{gemm, grouped_gemm, attention}: ms each from the kernel table. Each GEMM of the stage as its
    TE layer's forward and backward under the config's recipe (kernels.recipe_rows: FP8's casts and
    scaling in; an MoE layer's experts as one grouped layer where --moe-grouped-gemm is on, else a
    layer each), at its shape's measured rate; the output layer and the router stay BF16, as Megatron
    keeps them. Where the table has no layer rows of the recipe, the GEMM passes (forward, data and
    weight gradients) at their shapes' rates. Recomputed FLOPs at the stage's mean GEMM rate, recomputed
    attention at its forward's measured rate; attention at its shape's measured rate over the stage's
    attention FLOPs (a sliding window's fewer FLOPs at the same rate)."""
    recipe = ktable.recipe_rows(c)
    us = {"gemm": 0.0, "grouped_gemm": 0.0}
    for gm, layers in w.shapes:
        r = "bf16" if gm.kind in ("output", "router") else recipe
        grouped = gm.kind in ktable.GROUPED_KINDS
        groups = gm.calls if grouped and c.grouped_gemm else 1
        layer = table.layer_us(gm.m, gm.k, gm.n, groups, r)
        if layer is not None:
            cost = layer * gm.calls / groups
        else:
            d = ktable.precision(r)
            cost = gm.calls * sum(table.gemm_us(a, b, n, d) for a, b, n in gm.passes() if min(a, b, n) >= 1)
        us["grouped_gemm" if grouped else "gemm"] += layers * cost
    kinds = [k for k, v in w.flops.items() if v and k not in ATTENTION + ("recompute", "recompute_attention")]
    done = sum(w.flops[k] for k in kinds)
    if w.flops.get("recompute") and done:
        us["gemm"] += w.flops["recompute"] * (us["gemm"] + us["grouped_gemm"]) / done
    attention = sum(v for k, v in w.flops.items() if k in ATTENTION)
    ms = {k: v / 1e3 for k, v in us.items()}
    a = w.attention
    ms["attention"] = 0.0
    if attention and a is not None:
        fwd, bwd = table.attention_us(a)
        ms["attention"] = attention / (3 * a.forward_flop() / ((fwd + bwd) * 1e-6)) * 1e3
        ms["attention"] += w.flops.get("recompute_attention", 0.0) / (a.forward_flop() / (fwd * 1e-6)) * 1e3
    return ms


def compute_ms(w: StageWork, c: TrainingConfig, gpu_type: str, rates: Rates,
               table: ktable.KernelTable) -> dict[str, float]:
    """{gemm, grouped_gemm, attention, elementwise}: ms each on the GPU (kernels back to back):
    GEMMs and attention as the kernel table's GPU was measured to run their shapes (table_ms, moved
    by `kernel_table_rate`), the element-wise kernels' bytes at `hbm_efficiency` of the HBM rate."""
    g = gpus.GPUS[gpu_type]
    measured = {k: v / rates["kernel_table_rate"] for k, v in table_ms(w, c, table).items()}
    return {**measured, "elementwise": 1e3 * w.bytes / (g.hbm_tb_s * 1e12 * rates["hbm_efficiency"])}
