"""Combinations that Megatron or the MoE guidance forbid, as one table of rules.

`check(config, model, cluster)` returns a Violation for every row whose predicate holds. Each row
names the document it comes from and its message says what to change.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from moetune.experiment.config import (
    CUDA_GRAPH_MODULES,
    DISPATCHERS,
    FLEX_BACKENDS,
    FSDP_SHARDING,
    OFFLOAD_MODULES,
    RECOMPUTE_MODULES,
    TrainingConfig,
    layout_vpp,
)
from moetune.experiment.model import ModelArch
from moetune.experiment.pipeline import layout_problem, layout_stages, split_problem
from moetune.experiment.schema import Cluster

WORKFLOW = "moe-optimization-workflow.md"
OVERLAP = "moe-comm-overlap.txt"
DISPATCH = "moe-dispatcher-selection.txt"
README = "megatron-core-moe-readme.md"
MEGATRON = "Megatron-LM argument validation (megatron/training/arguments.py, TransformerConfig)"
ATTENTION = "Megatron-LM megatron/core/transformer/attention.py (whole heads per query group)"
ROUTER = "Megatron-LM megatron/core/transformer/moe/moe_utils.py (torch.topk over the experts)"
LAYOUT = "Megatron-LM megatron/core/transformer/pipeline_parallel_layer_layout.py"
DEVICE = "../shared/device-notes.md (seen on the GPU machine)"
GPU_SHEETS = "NVIDIA data sheets (FP8 tensor cores from Hopper on)"
FSDP_ADAPTER = "Megatron-LM megatron/core/distributed/fsdp/mcore_fsdp_adapter.py (Megatron FSDP's wrapper)"
FSDP_ONLY = ("Megatron-LM megatron/core/distributed/distributed_data_parallel_config.py (the sharding strategy "
             "is read by Megatron FSDP alone)")
DROPLESS_GRAPH_MODULES = ("attn", "moe_router", "moe_preprocess")


@dataclass(frozen=True)
class Violation:
    code: str
    message: str
    source: str

    def __str__(self) -> str:
        return f"{self.code}: {self.message} [{self.source}]"


@dataclass(frozen=True)
class Env:
    """What the predicates see besides the config: model sizes and the cluster."""

    m: ModelArch
    gpus: int
    generation: str  # hopper | blackwell
    has_te: bool
    has_deep_ep: bool
    nvlink_domain: int
    has_apex: bool = True

    def dp(self, c: TrainingConfig) -> int:
        return self.gpus // max(1, c.tp * c.pp * c.cp)



def _split_conflict(c: TrainingConfig) -> str:
    """The pipeline-split flags set together that Megatron takes only one at a time ('' where none)."""
    uneven = [f for f, on in (("--decoder-first-pipeline-num-layers", c.first_pp_layers is not None),
                              ("--decoder-last-pipeline-num-layers", c.last_pp_layers is not None)) if on]
    accounted = [f for f, on in (("--account-for-embedding-in-pipeline-split", c.account_for_embedding),
                                 ("--account-for-loss-in-pipeline-split", c.account_for_loss)) if on]
    if c.pp_layout and (uneven or accounted):
        return " and ".join(["--pipeline-model-parallel-layout", *uneven, *accounted])
    if uneven and accounted:
        return " and ".join(uneven + accounted)
    return ""


def _layout_problem(c: TrainingConfig, e: Env) -> str | None:
    return layout_problem(c.pp_layout or "", max(c.pp, 1), e.m.num_layers, e.m.mtp_num_layers)


def _te(c: TrainingConfig, e: Env) -> bool:
    return e.has_te and c.transformer_impl == "transformer_engine"


def _multiple(n: int, of: int) -> int:
    """The multiple of `of` nearest `n` (at least `of`): a global batch that would divide."""
    return max(of, round(n / of) * of)


def _graphed_recompute(c: TrainingConfig, module: str, scope: str) -> bool:
    """Selective recompute of `module` inside a graphed `scope` (a graph of the whole layer, as
    full-iteration graphs or graphs with no scope named, holds every scope; no modules named
    recomputes Megatron's default ones)."""
    if c.cuda_graph_impl == "none":
        return False
    whole_layer = c.cuda_graph_impl == "full_iteration" or not c.cuda_graph_modules
    return module in c.selective_modules and (whole_layer or scope in c.cuda_graph_modules)


Message = str | Callable[[TrainingConfig, Env], str]
Rule = tuple[str, str, Callable[[TrainingConfig, Env], bool], Message]

# (code, source, predicate: True when violated, message with the fix: text, or made from the
# config and the environment where the numbers tell the fix)
RULES: tuple[Rule, ...] = (
    ("gpus_not_divisible", MEGATRON, lambda c, e: e.gpus % (c.tp * c.pp * c.cp) != 0,
     lambda c, e: f"TP×PP×CP = {c.tp}×{c.pp}×{c.cp} = {c.tp * c.pp * c.cp} must divide the GPU count "
                  f"{e.gpus}; pick sizes whose product divides it"),
    ("expert_folding", WORKFLOW, lambda c, e: e.gpus % ((c.etp or c.tp) * c.ep * c.pp) != 0,
     lambda c, e: f"parallel folding needs ETP×EP×EDP×PP = world size: ETP×EP×PP = {c.etp or c.tp}×{c.ep}×"
                  f"{c.pp} = {(c.etp or c.tp) * c.ep * c.pp} must divide the GPU count {e.gpus}"),
    ("pipeline_split_conflict", MEGATRON, lambda c, e: bool(_split_conflict(c)),
     lambda c, e: f"{_split_conflict(c)} cannot be set together; give one form of pipeline split"),
    ("pipeline_layout_invalid", LAYOUT,
     lambda c, e: bool(c.pp_layout) and bool(_layout_problem(c, e)),
     lambda c, e: f"{_layout_problem(c, e)}"),
    ("pipeline_layout_vpp_conflict", MEGATRON,
     lambda c, e: bool(c.pp_layout) and not _layout_problem(c, e) and c.vpp != layout_vpp(c.pp_layout or "", c.pp),
     lambda c, e: f"--num-virtual-stages-per-pipeline-rank {c.vpp} conflicts with the layout's "
                  f"{layout_stages(c.pp_layout or '')} stages over PP {c.pp}; leave VPP to the layout"),
    ("layers_not_divisible_by_pp", MEGATRON,
     lambda c, e: not _split_conflict(c) and bool(split_problem(e.m.num_layers, c)),
     lambda c, e: str(split_problem(e.m.num_layers, c))),
    ("uneven_pp_without_pp", MEGATRON,
     lambda c, e: (c.first_pp_layers is not None or c.last_pp_layers is not None) and c.pp == 1,
     "first/last pipeline stage layers need PP > 1"),
    ("experts_not_divisible_by_ep", MEGATRON, lambda c, e: e.m.num_experts % c.ep != 0,
     lambda c, e: f"the number of experts ({e.m.num_experts}) must be divisible by EP ({c.ep})"),
    ("heads_not_divisible_by_tp", MEGATRON, lambda c, e: e.m.num_attention_heads % c.tp != 0,
     lambda c, e: f"attention heads ({e.m.num_attention_heads}) must be divisible by TP ({c.tp})"),
    ("heads_not_divisible_by_query_groups", ATTENTION,
     lambda c, e: e.m.num_attention_heads % e.m.num_query_groups != 0,
     lambda c, e: f"attention heads ({e.m.num_attention_heads}) must be divisible by query groups "
                  f"({e.m.num_query_groups})"),
    ("topk_exceeds_experts", ROUTER, lambda c, e: e.m.moe_router_topk > e.m.num_experts,
     lambda c, e: f"router top-k ({e.m.moe_router_topk}) must not exceed the number of experts "
                  f"({e.m.num_experts})"),
    ("query_groups_not_divisible_by_tp", MEGATRON, lambda c, e: e.m.num_query_groups % c.tp != 0,
     lambda c, e: f"query groups ({e.m.num_query_groups}) must be divisible by TP ({c.tp}); lower TP"),
    ("global_batch_not_divisible", MEGATRON,
     lambda c, e: e.dp(c) > 0 and c.global_batch % (c.micro_batch * e.dp(c)) != 0,
     lambda c, e: f"global batch {c.global_batch} must be a multiple of micro batch {c.micro_batch} × "
                  f"data-parallel size {e.dp(c)} (= {c.micro_batch * e.dp(c)}, from {e.gpus} GPUs / TP×PP×CP "
                  f"{c.tp * c.pp * c.cp}); e.g. global batch {_multiple(c.global_batch, c.micro_batch * e.dp(c))}"),
    ("sp_without_tp", MEGATRON, lambda c, e: c.sequence_parallel and c.tp == 1,
     "sequence parallel needs TP ≥ 2; turn it off or raise TP"),
    ("moe_tp_without_sp", MEGATRON, lambda c, e: c.tp > 1 and not c.sequence_parallel,
     "MoE with TP > 1 needs --sequence-parallel"),
    ("cp_seq_not_divisible", MEGATRON,
     lambda c, e: c.cp > 1 and (c.seq_length or e.m.seq_length) % (2 * c.cp) != 0,
     "context parallel needs the sequence length divisible by 2×CP"),
    ("vpp_without_pp", MEGATRON, lambda c, e: c.vpp is not None and c.pp == 1,
     "virtual pipeline stages need PP > 1"),
    ("ep_overlap_needs_ep", OVERLAP, lambda c, e: c.overlap_ep_a2a and c.ep == 1,
     "EP all-to-all overlap needs EP > 1"),
    ("ep_overlap_dispatcher", OVERLAP,
     lambda c, e: c.overlap_ep_a2a and c.dispatcher not in ("alltoall", "flex"),
     "EP all-to-all overlap needs the alltoall or flex dispatcher"),
    ("ep_overlap_needs_vpp", OVERLAP, lambda c, e: c.overlap_ep_a2a and c.pp > 1 and c.vpp is None,
     "EP all-to-all overlap with PP > 1 needs VPP (--num-virtual-stages-per-pipeline-rank)"),
    ("ep_overlap_shared_expert_overlap", OVERLAP, lambda c, e: c.overlap_ep_a2a and c.shared_expert_overlap,
     "turn off --moe-shared-expert-overlap when EP all-to-all overlap is on"),
    ("ep_overlap_full_recompute", OVERLAP,
     lambda c, e: c.overlap_ep_a2a and c.recompute_granularity == "full",
     "full recompute does not go with EP all-to-all overlap; use selective recompute"),
    ("ep_overlap_moe_recompute", MEGATRON,
     lambda c, e: c.overlap_ep_a2a and "moe" in c.selective_modules,
     "recomputing the whole MoE layer does not go with EP all-to-all overlap (Megatron 0.17+); "
     "recompute moe_act, or turn the overlap off"),
    ("delay_wgrad_needs_te", MEGATRON, lambda c, e: c.delay_wgrad and not _te(c, e),
     "--delay-wgrad-compute needs Transformer Engine (--transformer-impl transformer_engine)"),
    ("delay_wgrad_needs_overlap", OVERLAP, lambda c, e: c.delay_wgrad and not c.overlap_ep_a2a,
     "delayed wgrad is a companion of EP all-to-all overlap; turn the overlap on first"),
    ("flex_backend_without_flex", OVERLAP, lambda c, e: c.flex_backend and c.dispatcher != "flex",
     "a flex backend does nothing unless --moe-token-dispatcher-type flex"),
    ("flex_needs_deep_ep", DISPATCH, lambda c, e: c.dispatcher == "flex" and not e.has_deep_ep,
     "DeepEP/HybridEP need deep_ep in the job's image; use alltoall or an image with deep_ep"),
    ("hybridep_nvlink_domain", DISPATCH,
     lambda c, e: c.dispatcher == "flex" and c.flex_backend == "hybridep" and e.nvlink_domain < 2,
     "HybridEP needs the NVLink domain size (cluster.nvlink_domain, "
     "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN)"),
    ("tp_comm_overlap_needs_sp", MEGATRON,
     lambda c, e: c.tp_comm_overlap and (c.tp < 2 or not c.sequence_parallel),
     "TP comm overlap needs TP ≥ 2 and --sequence-parallel"),
    ("te_graphs_need_te", MEGATRON, lambda c, e: c.cuda_graph_impl == "transformer_engine" and not _te(c, e),
     "--cuda-graph-impl transformer_engine needs Transformer Engine"),
    ("te_graphs_delay_wgrad_need_apex", MEGATRON,
     lambda c, e: c.delay_wgrad and c.overlap_grad_reduce and c.cuda_graph_impl == "transformer_engine"
     and "attn" in c.cuda_graph_modules and not e.has_apex,
     "TE CUDA graphs of attention with delayed wgrad and overlapped grad reduce need gradient "
     "accumulation fusion (apex) for static addresses; drop attn from the graph scopes or delay_wgrad"),
    ("dropless_graph_scope", WORKFLOW,
     lambda c, e: c.cuda_graph_impl in ("local", "transformer_engine") and c.capacity_factor is None
     and (not c.cuda_graph_modules or set(c.cuda_graph_modules) - set(DROPLESS_GRAPH_MODULES)),
     "dropless MoE allows only partial CUDA graph modules: attn, moe_router, moe_preprocess"),
    ("full_iteration_needs_drop_pad", WORKFLOW,
     lambda c, e: c.cuda_graph_impl == "full_iteration" and not (c.capacity_factor and c.pad_to_capacity),
     "full-iteration CUDA graphs need drop-and-pad (--moe-expert-capacity-factor and "
     "--moe-pad-expert-input-to-capacity)"),
    ("full_iteration_with_modules", MEGATRON,
     lambda c, e: c.cuda_graph_impl == "full_iteration" and bool(c.cuda_graph_modules),
     "--cuda-graph-modules must be empty with --cuda-graph-impl full_iteration"),
    ("moe_preprocess_without_router", MEGATRON,
     lambda c, e: "moe_preprocess" in c.cuda_graph_modules and "moe_router" not in c.cuda_graph_modules,
     "the moe_preprocess graph module needs moe_router too"),
    ("graph_modules_without_impl", MEGATRON, lambda c, e: bool(c.cuda_graph_modules) and c.cuda_graph_impl == "none",
     "CUDA graph modules do nothing without --cuda-graph-impl"),
    ("full_recompute_with_te_graphs", WORKFLOW,
     lambda c, e: c.recompute_granularity == "full" and c.cuda_graph_impl == "transformer_engine",
     "TE-scoped CUDA graphs pair with selective recompute, not full recompute"),
    ("full_recompute_with_layer_graphs", MEGATRON,
     lambda c, e: c.recompute_granularity == "full" and c.cuda_graph_impl == "local",
     "full recompute runs only with full-iteration CUDA graphs; use selective recompute"),
    # A recomputed module inside a graphed scope replays its dropout's random numbers, which a
    # graph cannot draw: Megatron refuses it while dropout is on (0.1 by default; moetune leaves
    # it), so a fit of qwen3_30b_a3b's graphed layout with core_attn recompute stops at start-up
    # on a GPU: refused here, before any job.
    ("recompute_core_attn_in_graphed_attention", MEGATRON,
     lambda c, e: _graphed_recompute(c, "core_attn", "attn"),
     "Megatron does not recompute core attention inside a CUDA-graphed attention while attention "
     "dropout is on; graph attn or recompute core_attn, not both"),
    ("recompute_mlp_in_graphed_mlp", MEGATRON,
     lambda c, e: _graphed_recompute(c, "mlp", "mlp") or _graphed_recompute(c, "moe", "moe"),
     "Megatron does not recompute an MLP or MoE layer inside its CUDA graph while hidden dropout "
     "is on; graph it or recompute it, not both"),
    ("recompute_moe_with_graphed_router", MEGATRON,
     lambda c, e: c.cuda_graph_impl == "transformer_engine" and c.recompute_granularity == "selective"
     and "moe" in c.recompute_modules and "moe_router" in c.cuda_graph_modules,
     "Megatron does not recompute the whole MoE layer around a CUDA-graphed router; recompute "
     "moe_act, or drop moe_router from the graphs"),
    ("fp8_needs_te", MEGATRON, lambda c, e: bool(c.fp8_format or c.fp8_recipe) and not _te(c, e),
     "FP8 needs Transformer Engine"),
    ("fp8_needs_hopper_or_newer", GPU_SHEETS,
     lambda c, e: bool(c.fp8_format or c.fp8_recipe) and e.generation == "ampere",
     "FP8 needs a Hopper or Blackwell GPU; this GPU type has no FP8 tensor cores"),
    ("fp8_recipe_without_format", MEGATRON, lambda c, e: bool(c.fp8_recipe) and not c.fp8_format,
     "--fp8-recipe needs --fp8-format (e4m3 or hybrid)"),
    ("fp8_blockwise_not_on_blackwell", WORKFLOW,
     lambda c, e: c.fp8_recipe == "blockwise" and e.generation == "blackwell",
     "on Blackwell use the mxfp8 recipe, not blockwise"),
    ("mxfp8_needs_blackwell", WORKFLOW, lambda c, e: c.fp8_recipe == "mxfp8" and e.generation != "blackwell",
     "MXFP8 needs Blackwell; on Hopper use the blockwise recipe"),
    ("grouped_gemm_needs_te", DEVICE, lambda c, e: c.grouped_gemm and not _te(c, e),
     "--moe-grouped-gemm needs Transformer Engine in this stack"),
    ("moe_act_recompute_needs_grouped_gemm", DEVICE,
     lambda c, e: "moe_act" in c.recompute_modules and not c.grouped_gemm,
     "recompute of moe_act needs --moe-grouped-gemm"),
    ("recompute_modules_need_selective", MEGATRON,
     lambda c, e: bool(c.recompute_modules) and c.recompute_granularity != "selective",
     "--recompute-modules needs --recompute-granularity selective"),
    ("full_recompute_needs_layers", MEGATRON,
     lambda c, e: c.recompute_granularity == "full" and not c.recompute_num_layers,
     "full recompute needs --recompute-num-layers"),
    ("mla_up_proj_without_mla", MEGATRON,
     lambda c, e: "mla_up_proj" in c.recompute_modules and not e.m.multi_latent_attention,
     "mla_up_proj recompute needs a model with multi-latent attention"),
    ("shared_experts_recompute_without_shared", MEGATRON,
     lambda c, e: "shared_experts" in c.recompute_modules and not e.m.moe_shared_expert_intermediate_size,
     "shared_experts recompute needs a model with shared experts"),
    # Megatron FSDP turns the distributed optimizer on itself
    ("precision_aware_needs_distopt", MEGATRON,
     lambda c, e: c.precision_aware_optimizer and not (c.distributed_optimizer or c.fsdp),
     "--use-precision-aware-optimizer needs --use-distributed-optimizer (or --use-megatron-fsdp)"),
    ("param_gather_overlap_needs_distopt", MEGATRON,
     lambda c, e: c.overlap_param_gather and not ((c.distributed_optimizer or c.fsdp) and c.overlap_grad_reduce),
     "--overlap-param-gather needs --use-distributed-optimizer (or --use-megatron-fsdp) and --overlap-grad-reduce"),
    ("unknown_fsdp_sharding", MEGATRON, lambda c, e: c.fsdp_sharding not in FSDP_SHARDING,
     f"the FSDP sharding strategy (--data-parallel-sharding-strategy) must be one of {', '.join(FSDP_SHARDING)}"),
    ("fsdp_sharding_without_fsdp", FSDP_ONLY,
     lambda c, e: not c.fsdp and c.fsdp_sharding != FSDP_SHARDING[-1],
     "--data-parallel-sharding-strategy does nothing without --use-megatron-fsdp; turn FSDP on or leave "
     "the strategy at optim_grads_params"),
    ("fsdp_ep_overlap_layer_graphs", FSDP_ADAPTER,
     lambda c, e: c.fsdp and c.overlap_ep_a2a and c.cuda_graph_impl not in ("none", "full_iteration"),
     "EP all-to-all overlap under Megatron FSDP takes no per-layer CUDA graphs; use full_iteration "
     "graphs or none"),
    ("pad_without_capacity", MEGATRON, lambda c, e: c.pad_to_capacity and not c.capacity_factor,
     "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor"),
    ("unknown_dispatcher", README, lambda c, e: c.dispatcher not in DISPATCHERS,
     f"dispatcher must be one of {', '.join(DISPATCHERS)}"),
    ("unknown_flex_backend", README, lambda c, e: c.flex_backend is not None and c.flex_backend not in FLEX_BACKENDS,
     f"flex backend must be one of {', '.join(FLEX_BACKENDS)}"),
    ("unknown_recompute_module", README,
     lambda c, e: bool(set(c.recompute_modules) - set(RECOMPUTE_MODULES)),
     f"recompute modules must be among {', '.join(RECOMPUTE_MODULES)}"),
    ("unknown_graph_module", README,
     lambda c, e: bool(set(c.cuda_graph_modules) - set(CUDA_GRAPH_MODULES)),
     f"CUDA graph modules must be among {', '.join(CUDA_GRAPH_MODULES)}"),
    ("unknown_offload_module", MEGATRON,
     lambda c, e: bool(set(c.offload_modules) - set(OFFLOAD_MODULES)),
     f"offload modules must be among {', '.join(OFFLOAD_MODULES)}"),
    ("attn_proj_offload_without_core_attn", MEGATRON,
     lambda c, e: "attn_proj" in c.offload_modules and "core_attn" not in c.offload_modules,
     "offloading attn_proj needs core_attn offloaded too (its input is core_attn's output)"),
    ("offload_inside_recomputed_moe", MEGATRON,
     lambda c, e: c.recompute_granularity == "selective" and "moe" in c.recompute_modules
     and bool({"moe_act", "expert_fc1", "fused_group_mlp"} & set(c.offload_modules)),
     "do not offload moe_act/expert_fc1 while recomputing the whole MoE layer; drop one of them"),
    ("fused_group_mlp_offload_needs_op_fuser", MEGATRON,
     lambda c, e: "fused_group_mlp" in c.offload_modules,
     "fused_group_mlp offload needs TE's op fuser, which moetune does not enable; offload expert_fc1 "
     "or moe_act instead"),
    ("expert_bias_needs_sigmoid", MEGATRON,
     lambda c, e: e.m.moe_router_enable_expert_bias and e.m.moe_router_score_function != "sigmoid",
     "aux-loss-free expert bias needs --moe-router-score-function sigmoid; or drop the bias"),
    ("router_groups_not_dividing_experts", MEGATRON,
     lambda c, e: bool(e.m.moe_router_num_groups) and e.m.num_experts % e.m.moe_router_num_groups != 0,
     "--moe-router-num-groups must divide the number of experts (set it to EP or the nodes in EP)"),
    ("router_group_topk_too_large", MEGATRON,
     lambda c, e: bool(e.m.moe_router_group_topk)
     and (not e.m.moe_router_num_groups or e.m.moe_router_group_topk > e.m.moe_router_num_groups),
     "--moe-router-group-topk needs --moe-router-num-groups at least as large"),
    ("local_spec_sequence_parallel", DEVICE,
     lambda c, e: c.sequence_parallel and c.transformer_impl == "local",
     "sequence parallel is refused by torch LayerNorm under the local spec; use Transformer Engine"),
)


def env_of(model, cluster: Cluster) -> Env:
    """What the predicates see of the cluster. A capability left None (not set, not probed) reads
    as the field says: Transformer Engine and apex assumed there, DeepEP not."""
    return Env(m=model, gpus=cluster.world, generation=cluster.generation,
               has_te=cluster.has_transformer_engine is not False, has_deep_ep=bool(cluster.has_deep_ep),
               nvlink_domain=cluster.nvlink_domain, has_apex=cluster.has_apex is not False)


def check(config: TrainingConfig, model, cluster: Cluster) -> list[Violation]:
    e = env_of(model, cluster)
    return [Violation(code, msg(config, e) if callable(msg) else msg, src)
            for code, src, bad, msg in RULES if bad(config, e)]
