"""The first wall: will a layout fit? A per-GPU memory estimate, and the feasible layouts.

Weights, gradients and optimizer states follow mixed-precision Adam: bf16 weights (2 B), fp32
gradients (4 B), fp32 master weights and two moments (12 B); the distributed optimizer splits the
12 B over the data-parallel group (expert parameters over the expert-data-parallel group); the
precision-aware optimizer keeps the moments in bf16 (8 B). Activations are counted per layer for
one micro batch and multiplied by the micro batches a pipeline stage holds in flight. Sources:
moe-optimization-workflow.md (fit first, least model parallelism first; recompute and offload),
megatron-core-moe-readme.md (parallel folding, recompute modules).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from moetune.errors import MoetuneError
from moetune.estimate import activations, fsdp
from moetune.experiment import fit
from moetune.experiment.config import TrainingConfig, run_args
from moetune.experiment.constraints import check
from moetune.experiment.model import ModelArch
from moetune.experiment.pipeline import chunk_layers, mtp_rank, split_fields, splits

GB = 2**30
FIXED_GB = 3.0  # CUDA context, NCCL buffers, allocator slack: not in the model's figure
# TE CUDA graphs' private pools (cuda_graph_bytes): a fixed part a rank and a share of the graphed
# scopes' saved tensors, measured by moetune on one rank of Qwen3-30B-A3B at 8 and 16 layers (one
# H100, benchmarks/results/host_cost.json cuda_graph_memory "pools"): the GPU's peak with graphs
# over without, 2392 and 3660 MiB, through graphed_saved_bytes' 1391 and 2782
CUDA_GRAPH_POOL_FACTOR = 0.9116
CUDA_GRAPH_FIXED_GB = 1124 / 1024
# of the GPU's memory a planned estimate leaves free (a fit's is experiment/fit.py headroom_gb)
PLAN_HEADROOM_SHARE = 0.1


@dataclass(frozen=True)
class Params:
    """Parameter counts of one model, split by how they are sharded."""

    dense: float  # attention + dense MLP + shared experts: split by TP (and PP)
    experts: float  # routed experts: split by ETP x EP (and PP)
    replicated: float  # norms, routers: split only by PP
    embedding: float  # one embedding matrix (input or output), split by TP

    @property
    def total(self) -> float:
        return self.dense + self.experts + self.replicated + 2 * self.embedding


def padded_vocab(m: ModelArch, tp: int, multiple: int = 128) -> int:
    step = multiple * tp
    return int(math.ceil(m.vocab_size / step) * step)


def attention_params(m: ModelArch) -> float:
    h = m.hidden_size
    if m.multi_latent_attention:
        qk = m.qk_head_dim + m.qk_pos_emb_head_dim
        q = m.q_lora_rank * (h + m.num_attention_heads * qk) if m.q_lora_rank else h * m.num_attention_heads * qk
        kv = m.kv_lora_rank * (h + m.num_attention_heads * (m.qk_head_dim + m.v_head_dim)) + h * m.qk_pos_emb_head_dim
        return q + kv + m.num_attention_heads * m.v_head_dim * h
    d = m.kv_channels or h // m.num_attention_heads
    bias = d * (m.num_attention_heads + 2 * m.num_query_groups) if m.add_qkv_bias or m.add_bias_linear else 0
    bias += h if m.add_bias_linear else 0  # the output projection's
    sinks = m.num_attention_heads if m.softmax_type == "learnable" else 0  # one learnable offset a head
    return h * d * (2 * m.num_attention_heads + 2 * m.num_query_groups) + bias + sinks


def mla_replicated_params(m: ModelArch) -> float:
    """MLA's down-projections (q to q_lora_rank, kv to kv_lora_rank plus the shared RoPE key) and
    their norms are not split by tensor parallelism in Megatron (every TP rank holds them whole);
    with DeepSeek-V3 at TP8 that is 0.8 B parameters a rank that a /TP count misses (the fit lease:
    docs/memory.md)."""
    if not m.multi_latent_attention:
        return 0.0
    h = m.hidden_size
    q_down = h * m.q_lora_rank + m.q_lora_rank if m.q_lora_rank else 0
    return q_down + h * (m.kv_lora_rank + m.qk_pos_emb_head_dim) + m.kv_lora_rank


def mlp_bias(m: ModelArch, ffn: int) -> int:
    """One gated MLP's biases with add_bias_linear: its fc1's (gate and up halves) and fc2's."""
    return 2 * ffn + m.hidden_size if m.add_bias_linear else 0


def count_params(m: ModelArch, tp: int = 1) -> Params:
    h = m.hidden_size
    glu = 3  # SwiGLU: gate, up, down
    layers = m.num_layers
    moe_layers = m.moe_layers
    attn = attention_params(m) * layers
    dense_mlp = (glu * h * m.ffn_hidden_size + mlp_bias(m, m.ffn_hidden_size)) * (layers - moe_layers)
    shared_ffn = m.moe_shared_expert_intermediate_size or 0
    shared = (glu * h * shared_ffn + (mlp_bias(m, shared_ffn) if shared_ffn else 0)) * moe_layers
    experts = (glu * h * m.moe_ffn_hidden_size + mlp_bias(m, m.moe_ffn_hidden_size)) * m.num_experts * moe_layers
    norms = 2 * h * layers + h
    router = h * m.num_experts * moe_layers
    if m.first_dense_layers == 0 and m.num_experts <= 1:
        dense_mlp = (glu * h * m.ffn_hidden_size + mlp_bias(m, m.ffn_hidden_size)) * layers
    return Params(dense=attn + dense_mlp + shared, experts=experts, replicated=norms + router,
                  embedding=h * padded_vocab(m, tp))


def mtp_params(m: ModelArch) -> Params:
    """The multi-token-prediction layers (a MoE layer each where the model's last layer is), each
    with its projection of the normed embedding and hidden state (2h to h) and three norms (the
    embedding's, the hidden state's, its final one)."""
    if not m.mtp_num_layers:
        return Params(0, 0, 0, 0)
    h, n = m.hidden_size, m.mtp_num_layers
    shared = 3 * h * (m.moe_shared_expert_intermediate_size or 0)
    return Params(dense=n * (attention_params(m) + shared + 2 * h * h),
                  experts=n * 3 * h * m.moe_ffn_hidden_size * m.num_experts,
                  replicated=n * (2 * h + h * m.num_experts + 3 * h), embedding=0)


class TooFewGPUs(MoetuneError):
    """A layout's model-parallel groups need more GPUs than there are."""

    def __init__(self, c: TrainingConfig, gpus: int):
        self.needed, self.gpus = min_gpus(c), gpus
        super().__init__(f"the layout TP{c.tp} PP{c.pp} EP{c.ep} CP{c.cp} needs {self.needed} GPUs "
                         f"(or a multiple); {gpus} given")


def min_gpus(c: TrainingConfig) -> int:
    """The fewest GPUs a layout runs on: its dense (TP x PP x CP) and expert (ETP x EP x PP) groups."""
    return math.lcm(c.tp * c.pp * c.cp, (c.etp or c.tp) * c.ep * c.pp)


def bytes_per_param(shards: int, c: TrainingConfig) -> float:
    optimizer = 8.0 if c.precision_aware_optimizer else 12.0
    if c.distributed_optimizer:
        optimizer /= shards
    return 2 + 4 + optimizer


def activation_bytes_per_layer(m: ModelArch, c: TrainingConfig, moe: bool) -> float:
    """One layer, one micro batch, on one GPU (the tensors saved for backward: estimate/activations.py)."""
    return activations.layer_bytes(m, c, moe)


def in_flight(c: TrainingConfig, microbatches: int, stage: int = 0) -> float:
    """Micro batches whose activations pipeline rank `stage` holds at its peak, in units of a full
    stage (1F1B: PP - stage; interleaved: the schedule's warm-up chunks over VPP, for the first
    stage PP x (1 + (PP-1)/(PP x VPP)))."""
    if c.pp == 1:
        return 1.0
    if c.vpp:
        return ((c.pp - stage - 1) * 2 + (c.vpp - 1) * c.pp + 1) / c.vpp
    return min(microbatches, c.pp - stage)


@dataclass
class Estimate:
    weights_gb: float
    grads_gb: float
    optimizer_gb: float
    activations_gb: float
    fixed_gb: float = FIXED_GB
    cuda_graphs_gb: float = 0.0  # the graphs' private pools, beside the regular pool's activations
    parameters_b: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def model_state_gb(self) -> float:
        return self.weights_gb + self.grads_gb + self.optimizer_gb

    @property
    def total_gb(self) -> float:
        return self.model_state_gb + self.activations_gb + self.cuda_graphs_gb + self.fixed_gb

    def to_dict(self) -> dict:
        return {"weights_gb": round(self.weights_gb, 3), "grads_gb": round(self.grads_gb, 3),
                "optimizer_gb": round(self.optimizer_gb, 3), "activations_gb": round(self.activations_gb, 3),
                "cuda_graphs_gb": round(self.cuda_graphs_gb, 3), "fixed_gb": self.fixed_gb,
                "total_gb": round(self.total_gb, 3)}


def stage_layers(m: ModelArch, c: TrainingConfig, stage: int = 0) -> tuple[float, float]:
    """(dense-MLP layers, MoE layers) pipeline rank `stage` builds, in any form of split
    (experiment/pipeline.py), the model's leading dense layers first."""
    chunks = chunk_layers(m.num_layers, c)
    if m.num_experts <= 1:
        return float(sum(chunks[stage])), 0.0
    kinds = m.layer_kinds()
    dense = 0
    layer = 0
    for v in range(max(len(r) for r in chunks)):
        for s, ranks in enumerate(chunks):
            size = ranks[v] if v < len(ranks) else 0
            if s == stage:
                dense += kinds[layer:layer + size].count(0)
            layer += size
    return float(dense), float(sum(chunks[stage]) - dense)


def estimate(m: ModelArch, c: TrainingConfig, gpus: int, routing: bool = True,
             stage: int | None = None) -> Estimate:
    """Peak memory of the heaviest pipeline stage's rank (the first holds the embedding and the
    most micro batches in flight; an uneven split may load another more), as Megatron's `max
    allocated` reports it (weights, gradients, optimizer states, activations) plus FIXED_GB.
    Checked against the fit lease (docs/memory.md). `stage`: that pipeline rank's, not the heaviest.
    `routing=False` prices every layer as a dense layer of `ffn_hidden_size` spread evenly over the
    stages, with MTP on the stage, the scope of Megatron's own theoretical figure (for comparing
    like with like, not for planning)."""
    if gpus < min_gpus(c):
        raise TooFewGPUs(c, gpus)
    if not routing:
        return _estimate_dense_scope(m, c, gpus)
    if stage is not None:
        return _stage_estimate(m, c, gpus, stage)
    stages = [_stage_estimate(m, c, gpus, s) for s in range(max(c.pp, 1))]
    return max(stages, key=lambda e: e.total_gb)


def _stage_estimate(m: ModelArch, c: TrainingConfig, gpus: int, stage: int) -> Estimate:
    """estimate() of pipeline rank `stage`: its layers, the embedding on the first."""
    p = count_params(m, c.tp)
    dp = c.data_parallel(gpus)
    etp = c.etp or c.tp
    edp = gpus // (etp * c.ep * c.pp)
    h, E = m.hidden_size, m.num_experts
    n_dense, n_moe = stage_layers(m, c, stage)
    n = n_dense + n_moe
    mla_rep = mla_replicated_params(m)
    attn_split = attention_params(m) - mla_rep
    moe = m.num_experts > 1
    dense_mlp = 3 * h * m.ffn_hidden_size
    shared = 3 * h * (m.moe_shared_expert_intermediate_size or 0)
    expert = 3 * h * m.moe_ffn_hidden_size * E if moe else 0
    dense = (attn_split * n + dense_mlp * n_dense + shared * n_moe + (p.embedding if stage == 0 else 0)) / c.tp
    replicated = (mla_rep + 2 * h) * n + (h * E if moe else 0) * n_moe
    experts = expert * n_moe / (etp * c.ep)
    if stage == max(c.pp, 1) - 1:  # the last stage: the output layer, the final norm
        dense += p.embedding / c.tp
        replicated += h
    if stage == mtp_rank(c, m.mtp_num_layers):  # the MTP layers where they are built
        mtp = mtp_params(m)
        dense += mtp.dense / c.tp
        if stage != 0:  # Megatron builds the input embedding there too, for the next tokens
            dense += p.embedding / c.tp
        replicated += mtp.replicated
        experts += mtp.experts / (etp * c.ep)
    weights = 2 * (dense + replicated + experts)
    grads = 4 * (dense + replicated + experts)
    opt = ((bytes_per_param(dp * c.cp, c) - 6) * (dense + replicated)
           + (bytes_per_param(edp, c) - 6) * experts)
    if c.fsdp:  # Megatron FSDP in place of the above (estimate/fsdp.py)
        layer = (p.dense / c.tp + p.replicated + p.experts / (etp * c.ep)) / m.num_layers
        fs = fsdp.model_state(c, dense + replicated, experts, dp * c.cp, edp, layer)
        weights, grads, opt = fs.weights, fs.grads, fs.optimizer
    microbatches = max(1, c.global_batch // (c.micro_batch * max(dp, 1)))
    s = (c.seq_length or m.seq_length) / c.cp
    if c.recompute_granularity == "full":
        per_stage = n * 2 * s * c.micro_batch * h / (c.tp if c.sequence_parallel else 1)
    else:
        per_stage = (n_dense * activation_bytes_per_layer(m, c, moe=False)
                     + n_moe * activation_bytes_per_layer(m, c, moe=True))
    held = in_flight(c, microbatches, stage)
    act = per_stage * held
    if stage == 0:
        act += activations.embedding_bytes(m, c) * held
    if n_moe and c.recompute_granularity != "full":  # one MoE layer's working copies, while it runs
        act += activations.moe_transient_bytes(m, c)
    if stage == max(c.pp, 1) - 1:  # the loss on the last stage, one micro batch at a time there
        act += activations.logits_bytes(m, c, padded_vocab(m, c.tp))
    if stage == mtp_rank(c, m.mtp_num_layers):
        act += activations.mtp_bytes(m, c, padded_vocab(m, c.tp)) * in_flight(c, microbatches, stage)
    graphs = cuda_graph_bytes(m, c, n_dense, n_moe, held)
    notes = []
    if c.recompute_granularity == "full":
        notes.append("full recompute: one checkpoint per layer")
    if c.fsdp:
        notes.append(f"Megatron FSDP {c.fsdp_sharding}: {fs.gathered / GB:.1f} GB of two layers held whole")
    if graphs:
        notes.append(f"CUDA graphs: {graphs / GB:.1f} GB in their private pools")
    return Estimate(weights / GB, grads / GB, opt / GB, act / GB, cuda_graphs_gb=graphs / GB,
                    parameters_b=(p.total + mtp_params(m).total) / 1e9, notes=notes)


def graphed_saved_bytes(m: ModelArch, c: TrainingConfig, n_dense: float, n_moe: float, held: float) -> float:
    """What TE's CUDA graphs of a stage keep in their private pools for backward: the graphed scopes'
    saved tensors (activations.graphed_bytes) of each layer, for the micro-batches in flight at the
    peak (Megatron captures one at PP 1 without EP overlap, every one of a step at PP > 1, and TE
    reuses a captured micro-batch's buffers once its backward has run, so the schedule's depth
    stays). The regular pool still holds everything outside the graphs."""
    return held * (n_dense * activations.graphed_bytes(m, c, moe=False)
                   + n_moe * activations.graphed_bytes(m, c, moe=True))


def cuda_graph_bytes(m: ModelArch, c: TrainingConfig, n_dense: float, n_moe: float, held: float) -> float:
    """The graphs' private pools on a stage, on top of the regular pool: a rank's fixed part and
    the saved tensors at the measured rate (CUDA_GRAPH_FIXED_GB, CUDA_GRAPH_POOL_FACTOR). Measured
    with TE's graphs; Megatron's local graphs (a pool a micro-batch at PP > 1) are priced alike,
    unmeasured."""
    saved = graphed_saved_bytes(m, c, n_dense, n_moe, held)
    return CUDA_GRAPH_FIXED_GB * GB + CUDA_GRAPH_POOL_FACTOR * saved if saved else 0.0


def _estimate_dense_scope(m: ModelArch, c: TrainingConfig, gpus: int) -> Estimate:
    """Peak memory of the most loaded GPU (the first pipeline stage, which holds the embedding).
    `routing=False` prices every layer as a dense layer of `ffn_hidden_size`, the scope of
    Megatron's own theoretical figure (for comparing like with like, not for planning)."""
    p = count_params(m, c.tp)
    dp = c.data_parallel(gpus)
    etp = c.etp or c.tp
    edp = gpus // (etp * c.ep * c.pp)
    mtp = mtp_params(m)
    # the most loaded stage: a 1/PP share of the layers, the embedding, and (as Megatron's own
    # figure counts it) the MTP layers, which sit on the last stage beside the output layer
    dense = (p.dense / c.pp + mtp.dense + p.embedding) / c.tp + p.replicated / c.pp + mtp.replicated
    if c.pp == 1:
        dense += p.embedding / c.tp  # the output layer sits on the same stage
    experts = (p.experts / c.pp + mtp.experts) / (etp * c.ep)
    shard_dense = dp * c.cp
    weights = 2 * (dense + experts)
    grads = 4 * (dense + experts)
    opt = (bytes_per_param(shard_dense, c) - 6) * dense + (bytes_per_param(edp, c) - 6) * experts
    microbatches = max(1, c.global_batch // (c.micro_batch * max(dp, 1)))
    layers_per_stage = m.num_layers / c.pp
    dense_share = 1.0  # every layer as a dense layer
    if c.recompute_granularity == "full":
        s = (c.seq_length or m.seq_length) / c.cp
        per_layer = 2 * s * c.micro_batch * m.hidden_size / (c.tp if c.sequence_parallel else 1)
    else:
        per_layer = (dense_share * activation_bytes_per_layer(m, c, moe=False)
                     + (1 - dense_share) * activation_bytes_per_layer(m, c, moe=True))
    act = per_layer * layers_per_stage * in_flight(c, microbatches)
    if c.pp == 1:  # logits in fp32 on the only stage
        s = (c.seq_length or m.seq_length) / c.cp
        act += 4 * s * c.micro_batch * padded_vocab(m, c.tp) / c.tp
    notes = []
    if c.recompute_granularity == "full":
        notes.append("full recompute: one checkpoint per layer")
    return Estimate(weights / GB, grads / GB, opt / GB, act / GB, parameters_b=(p.total + mtp.total) / 1e9,
                    notes=notes)


# -- layouts --------------------------------------------------------------------------------
@dataclass
class Layout:
    config: TrainingConfig
    args: list[str]
    memory_gb: float  # the estimate with FIXED_GB: what the GPU must hold
    breakdown: dict
    tp_pp: int  # TP x PP, what `plan` orders layouts by (least first)
    fits: bool = True  # memory_gb within the GPU's memory less PLAN_HEADROOM_SHARE, constraints passed
    capacity_gb: float | None = None
    refused: list[str] = field(default_factory=list)  # constraint codes that refuse it
    measured_gb: float | None = None  # a fit's or a run's measured peak of this layout (the store's)

    @property
    def measured_oom(self) -> bool:
        """A run or fit of it ran out of memory on a GPU this size (measured_gb OUT_OF_MEMORY)."""
        return self.measured_gb is not None and math.isinf(self.measured_gb)

    @property
    def estimate_gb(self) -> float:
        """The estimate of the peak Megatron's `max allocated` reports (no fixed overhead)."""
        return self.memory_gb - FIXED_GB

    def to_dict(self) -> dict:
        return {"args": self.args, "estimate_gb": round(self.estimate_gb, 2),
                "memory_gb": round(self.memory_gb, 2), "fits": self.fits, "capacity_gb": self.capacity_gb,
                "refused": self.refused, "breakdown": self.breakdown,
                "tp_pp": self.tp_pp, "config": self.config.to_dict(),
                **({} if self.measured_gb is None else {"measured_oom": True} if self.measured_oom
                   else {"measured_gb": round(self.measured_gb, 2)})}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def plan_cluster(exp, gpus: int | None = None, gpu_type: str | None = None):
    """The experiment's cluster section with --gpus / --gpu-type applied: (cluster, world, capacity GB)."""
    cluster = exp.cluster.model_copy(update={k: v for k, v in (("gpu_type", gpu_type),) if v})
    if gpus:
        cluster = cluster.with_gpus(gpus)
    return cluster, cluster.world, cluster.memory_gb


Measured = Callable[[TrainingConfig], "float | None"]  # a layout's measured peak, where known
# a layout's measured "peak" where a run or fit of it ran out of memory on a GPU at least as large:
# no figure, and it does not fit
OUT_OF_MEMORY = math.inf


def fits_measured(peak_gb: float | None, capacity_gb: float) -> bool:
    """A measured peak judged as a fit is (experiment/fit.py): with the fit's headroom, not the estimate's."""
    return peak_gb is not None and peak_gb + fit.headroom_gb(capacity_gb) <= capacity_gb


def fits_plan(total_gb: float, capacity_gb: float, peak_gb: float | None = None,
              headroom_share: float = PLAN_HEADROOM_SHARE) -> bool:
    """The plan's test of fit: a measured peak where the store holds one, judged as a fit judges it
    (fits_measured), in both directions (a layout measured over the GPU, or out of memory, does not
    fit whatever its estimate); else the estimate (fixed overhead included) within the GPU's memory
    less `headroom_share`."""
    if peak_gb is not None:
        return fits_measured(peak_gb, capacity_gb)
    return total_gb <= (1 - headroom_share) * capacity_gb


def baseline_layout(exp, gpus: int | None = None, gpu_type: str | None = None,
                    headroom_share: float = PLAN_HEADROOM_SHARE, measured: Measured | None = None) -> Layout:
    """The experiment's own baseline as a layout, fitting or not (`fits` says which; `refused`
    names the constraints it breaks): the first trial a study submits, so the user sees whether
    it fits before it goes to the cluster (moe-optimization-workflow.md, Phase 1: fit first)."""
    cluster, world, capacity = plan_cluster(exp, gpus, gpu_type)
    cfg = exp.baseline
    if world % min_gpus(cfg):
        raise TooFewGPUs(cfg, world)
    est = estimate(exp.model, cfg, world)
    refused = [v.code for v in check(cfg, exp.model, cluster)]
    peak = measured(cfg) if measured else None
    fits = fits_plan(est.total_gb, capacity, peak, headroom_share)
    return Layout(cfg, cfg.to_args(exp.model) + run_args(), est.total_gb, est.to_dict(), cfg.tp * cfg.pp,
                  fits=not refused and fits, capacity_gb=capacity, refused=refused, measured_gb=peak)


def vpp_choices(m: ModelArch, pp: int, most: int = 8) -> list[int]:
    """Virtual stages per pipeline rank over which Megatron can split the model's layers: evenly,
    or with uneven first/last stages or the embedding and loss counted (pipeline.split_fields)."""
    return [v for v in range(2, most + 1) if pp > 1 and splits(m.num_layers, pp, v)]


PLAN_TP = (1, 2, 4, 8)  # the TPs plan() tries: within a node's NVLink
PLAN_MAX_PP = 32  # the most pipeline stages plan() tries


def plan(exp, gpus: int | None = None, gpu_type: str | None = None, limit: int = 20,
         headroom_share: float = PLAN_HEADROOM_SHARE, measured: Measured | None = None,
         virtual: bool = False, refused: list | None = None, fixed: dict | None = None) -> list[Layout]:
    """Feasible layouts for the experiment's model, least model parallelism first (TP×PP, then
    expert parallelism within NVLink before across it, then the smaller EP), selective recompute
    only where a layout does not fit without it (moe-optimization-workflow.md, Phase 1). A layout
    is feasible when it passes the constraint table and, where the store holds no measurement of
    it, its estimate, fixed overhead included, leaves `headroom_share` of the GPU's memory free;
    where it does (`measured`), when its measured peak fits as a fit's does (qwen3_235b's TP2 PP2
    EP128 on an H100 is estimated within 2 % of the 68.9 GB it measured, but the estimate's margin
    is wider than a measurement's; a layout that ran out of memory does not fit). `virtual`: each pipeline
    with every VPP of vpp_choices too. A PP (x VPP) the layers do not divide gets the uneven split
    Megatron can build (pipeline.split_fields). `refused`: a list that gets, for each candidate
    left out, the constraint violations that refused it (an empty list: its memory did not fit).
    `fixed`: TrainingConfig fields every candidate keeps (`moetune plan --pp 8 ...`)."""
    fixed = fixed or {}

    def keep(field: str, values: list) -> list:
        return [v for v in values if v == fixed[field]] if field in fixed else values

    cluster, world, capacity = plan_cluster(exp, gpus, gpu_type)
    m, base = exp.model, exp.baseline
    out: list[Layout] = []
    recomputes: list[tuple[str, ...]] = [(), ("moe_act", "layernorm") if base.grouped_gemm else ("layernorm",)]
    if "recompute_granularity" in fixed:
        recomputes = [fixed.get("recompute_modules", ())]
    for tp in keep("tp", [t for t in PLAN_TP if world % t == 0]):
        for pp in keep("pp", [p for p in _divisors(world) if p <= PLAN_MAX_PP and world % (tp * p) == 0]):
            for ep, vpp in [(e, v) for e in keep("ep", [e for e in _divisors(m.num_experts)
                                                        if e <= 128 and world % (e * pp) == 0])
                            for v in keep("vpp", [None] + (vpp_choices(m, pp) if virtual or "vpp" in fixed else []))]:
                for recompute in recomputes:
                    cfg = base.replace(tp=tp, pp=pp, ep=ep, etp=1, sequence_parallel=tp > 1, vpp=vpp,
                                       **split_fields(m.num_layers, pp, vpp),
                                       distributed_optimizer=True,
                                       recompute_granularity="selective" if recompute else None,
                                       recompute_modules=recompute)
                    if fixed:
                        cfg = cfg.replace(**fixed)
                    violations = check(cfg, m, cluster)
                    if violations:
                        if refused is not None:
                            refused.append(violations)
                        continue
                    est = estimate(m, cfg, world)
                    peak = measured(cfg) if measured else None
                    if not fits_plan(est.total_gb, capacity, peak, headroom_share):
                        if refused is not None:
                            refused.append([])
                        continue
                    out.append(Layout(cfg, cfg.to_args(m) + run_args(), est.total_gb, est.to_dict(), tp * pp,
                                      capacity_gb=capacity, measured_gb=peak))
                    break  # selective recompute only where the layout does not fit without it
    out.sort(key=lambda lay: (lay.tp_pp, lay.config.pp, lay.config.ep > cluster.nvlink_domain,
                              bool(lay.config.recompute_modules), lay.config.ep, lay.memory_gb))
    return out[:limit]
