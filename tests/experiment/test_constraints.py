"""Forbidden combinations, each refused with its own code and a message that names the fix."""
import pytest

from moetune.experiment.config import FSDP_SHARDING, TrainingConfig
from moetune.experiment.constraints import RULES, check
from moetune.experiment.schema import Cluster, load_experiment
from moetune.experiment.model import ModelArch

MODEL = ModelArch("t", num_layers=8, hidden_size=1024, num_attention_heads=16, num_query_groups=4,
                  ffn_hidden_size=4096, moe_ffn_hidden_size=1024, num_experts=16, moe_router_topk=2,
                  vocab_size=32000, seq_length=4096)
MLA = ModelArch("mla", num_layers=8, hidden_size=1024, num_attention_heads=16, num_query_groups=16,
                ffn_hidden_size=4096, moe_ffn_hidden_size=1024, num_experts=16, moe_router_topk=2,
                vocab_size=32000, seq_length=4096, multi_latent_attention=True, q_lora_rank=256,
                kv_lora_rank=128, qk_head_dim=64, qk_pos_emb_head_dim=32, v_head_dim=64)
H100 = {"nodes": 2, "gpus_per_node": 8, "gpu_type": "H100", "has_transformer_engine": True,
        "has_deep_ep": True, "nvlink_domain": 8}
OK = TrainingConfig(tp=2, sequence_parallel=True, ep=8, etp=1, micro_batch=1, global_batch=64)

CASES = [
    # (changes, cluster changes, expected code)
    ({"tp": 3, "sequence_parallel": True}, {}, "gpus_not_divisible"),
    ({"ep": 16, "etp": 2, "pp": 2}, {}, "expert_folding"),
    ({"pp": 3}, {"gpus_per_node": 12, "nodes": 1}, "layers_not_divisible_by_pp"),
    ({"first_pp_layers": 2}, {}, "uneven_pp_without_pp"),
    ({"ep": 3}, {"gpus_per_node": 6, "nodes": 1}, "experts_not_divisible_by_ep"),
    ({"tp": 8, "ep": 2}, {"gpus_per_node": 8, "nodes": 1}, "query_groups_not_divisible_by_tp"),
    ({"global_batch": 60}, {}, "global_batch_not_divisible"),
    ({"tp": 1, "sequence_parallel": True}, {}, "sp_without_tp"),
    ({"sequence_parallel": False}, {}, "moe_tp_without_sp"),
    ({"cp": 2, "seq_length": 4094}, {}, "cp_seq_not_divisible"),
    ({"vpp": 2}, {}, "vpp_without_pp"),
    ({"ep": 1, "overlap_ep_a2a": True}, {}, "ep_overlap_needs_ep"),
    ({"overlap_ep_a2a": True, "dispatcher": "allgather"}, {}, "ep_overlap_dispatcher"),
    ({"overlap_ep_a2a": True, "pp": 2}, {}, "ep_overlap_needs_vpp"),
    ({"overlap_ep_a2a": True, "shared_expert_overlap": True}, {}, "ep_overlap_shared_expert_overlap"),
    ({"overlap_ep_a2a": True, "recompute_granularity": "full", "recompute_num_layers": 1}, {},
     "ep_overlap_full_recompute"),
    ({"overlap_ep_a2a": True, "recompute_granularity": "selective", "recompute_modules": ["moe"]}, {},
     "ep_overlap_moe_recompute"),
    ({"overlap_ep_a2a": True, "delay_wgrad": True, "transformer_impl": "local"}, {}, "delay_wgrad_needs_te"),
    ({"delay_wgrad": True}, {}, "delay_wgrad_needs_overlap"),
    ({"overlap_ep_a2a": True, "delay_wgrad": True, "overlap_grad_reduce": True,
      "distributed_optimizer": True, "cuda_graph_impl": "transformer_engine",
      "cuda_graph_modules": ["attn"]}, {"has_apex": False}, "te_graphs_delay_wgrad_need_apex"),
    ({"flex_backend": "deepep"}, {}, "flex_backend_without_flex"),
    ({"dispatcher": "flex", "flex_backend": "deepep"}, {"has_deep_ep": False}, "flex_needs_deep_ep"),
    ({"dispatcher": "flex", "flex_backend": "hybridep"}, {"nvlink_domain": 1}, "hybridep_nvlink_domain"),
    ({"tp": 1, "sequence_parallel": False, "tp_comm_overlap": True}, {}, "tp_comm_overlap_needs_sp"),
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ["attn"]},
     {"has_transformer_engine": False}, "te_graphs_need_te"),
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ["moe"]}, {}, "dropless_graph_scope"),
    ({"cuda_graph_impl": "local"}, {}, "dropless_graph_scope"),
    ({"cuda_graph_impl": "full_iteration"}, {}, "full_iteration_needs_drop_pad"),
    ({"cuda_graph_impl": "full_iteration", "cuda_graph_modules": ["attn"], "capacity_factor": 1.0,
      "pad_to_capacity": True}, {}, "full_iteration_with_modules"),
    ({"cuda_graph_impl": "local", "cuda_graph_modules": ["moe_preprocess"]}, {}, "moe_preprocess_without_router"),
    ({"cuda_graph_modules": ["attn"]}, {}, "graph_modules_without_impl"),
    ({"recompute_granularity": "full", "recompute_num_layers": 1, "cuda_graph_impl": "transformer_engine",
      "cuda_graph_modules": ["attn"]}, {}, "full_recompute_with_te_graphs"),
    ({"recompute_granularity": "full", "recompute_num_layers": 1, "cuda_graph_impl": "local",
      "capacity_factor": 1.0, "pad_to_capacity": True}, {}, "full_recompute_with_layer_graphs"),
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ["attn"], "capacity_factor": 1.0,
      "pad_to_capacity": True, "recompute_granularity": "selective", "recompute_modules": ["core_attn"]},
     {}, "recompute_core_attn_in_graphed_attention"),
    # no modules named: Megatron recomputes its default, core_attn
    ({"cuda_graph_impl": "local", "capacity_factor": 1.0, "recompute_granularity": "selective"},
     {}, "recompute_core_attn_in_graphed_attention"),
    ({"cuda_graph_impl": "local", "capacity_factor": 1.0, "pad_to_capacity": True,
      "recompute_granularity": "selective", "recompute_modules": ["moe"]}, {}, "recompute_mlp_in_graphed_mlp"),
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ["moe_router"], "capacity_factor": 1.0,
      "pad_to_capacity": True, "recompute_granularity": "selective", "recompute_modules": ["moe"]},
     {}, "recompute_moe_with_graphed_router"),
    ({"fp8_format": "e4m3", "fp8_recipe": "blockwise"}, {"has_transformer_engine": False}, "fp8_needs_te"),
    ({"fp8_recipe": "blockwise"}, {}, "fp8_recipe_without_format"),
    ({"fp8_format": "e4m3", "fp8_recipe": "blockwise"}, {"gpu_type": "B200"}, "fp8_blockwise_not_on_blackwell"),
    ({"fp8_format": "e4m3", "fp8_recipe": "mxfp8"}, {"gpu_type": "H100"}, "mxfp8_needs_blackwell"),
    ({"grouped_gemm": True, "transformer_impl": "local", "tp": 1, "sequence_parallel": False}, {},
     "grouped_gemm_needs_te"),
    ({"recompute_granularity": "selective", "recompute_modules": ["moe_act"]}, {},
     "moe_act_recompute_needs_grouped_gemm"),
    ({"recompute_modules": ["core_attn"]}, {}, "recompute_modules_need_selective"),
    ({"recompute_granularity": "full"}, {}, "full_recompute_needs_layers"),
    ({"recompute_granularity": "selective", "recompute_modules": ["mla_up_proj"]}, {}, "mla_up_proj_without_mla"),
    ({"recompute_granularity": "selective", "recompute_modules": ["shared_experts"]}, {},
     "shared_experts_recompute_without_shared"),
    ({"precision_aware_optimizer": True}, {}, "precision_aware_needs_distopt"),
    ({"overlap_param_gather": True, "distributed_optimizer": True}, {}, "param_gather_overlap_needs_distopt"),
    ({"pad_to_capacity": True}, {}, "pad_without_capacity"),
    ({"dispatcher": "ring"}, {}, "unknown_dispatcher"),
    ({"dispatcher": "flex", "flex_backend": "nvshmem"}, {}, "unknown_flex_backend"),
    ({"recompute_granularity": "selective", "recompute_modules": ["everything"]}, {}, "unknown_recompute_module"),
    ({"cuda_graph_impl": "local", "cuda_graph_modules": ["attn", "optimizer"]}, {}, "unknown_graph_module"),
    ({"transformer_impl": "local"}, {}, "local_spec_sequence_parallel"),
    ({"offload_modules": ["mlp"]}, {}, "unknown_offload_module"),
    ({"offload_modules": ["attn_proj"]}, {}, "attn_proj_offload_without_core_attn"),
    ({"grouped_gemm": True, "recompute_granularity": "selective", "recompute_modules": ["moe"],
      "offload_modules": ["expert_fc1"]}, {}, "offload_inside_recomputed_moe"),
    ({"offload_modules": ["fused_group_mlp"]}, {}, "fused_group_mlp_offload_needs_op_fuser"),
    ({"fsdp": True, "fsdp_sharding": "everything"}, {}, "unknown_fsdp_sharding"),
    ({"fsdp_sharding": "optim"}, {}, "fsdp_sharding_without_fsdp"),
    ({"fsdp": True, "overlap_ep_a2a": True, "cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ["attn"]},
     {}, "fsdp_ep_overlap_layer_graphs"),
]


# Forbidden in the model section (the router), checked with the OK training config.
MODEL_CASES = [
    ({"moe_router_enable_expert_bias": True}, "expert_bias_needs_sigmoid"),
    ({"moe_router_score_function": "sigmoid", "moe_router_num_groups": 3, "moe_router_group_topk": 1},
     "router_groups_not_dividing_experts"),
    ({"moe_router_score_function": "sigmoid", "moe_router_num_groups": 4, "moe_router_group_topk": 8},
     "router_group_topk_too_large"),
]


@pytest.mark.parametrize("changes, code", MODEL_CASES, ids=[c[1] for c in MODEL_CASES])
def test_forbidden_router_is_refused(changes, code):
    """Each forbidden router setting of the model is refused by its row."""
    from dataclasses import replace
    codes = [v.code for v in check(OK, replace(MODEL, **changes), Cluster(**H100))]
    assert code in codes, codes


def test_grouped_sigmoid_router_with_bias_passes():
    """A grouped sigmoid router with expert bias, set as Megatron allows, passes the table."""
    from dataclasses import replace
    m = replace(MODEL, moe_router_score_function="sigmoid", moe_router_num_groups=4, moe_router_group_topk=2,
                moe_router_enable_expert_bias=True, moe_router_topk_scaling_factor=2.5)
    assert check(OK, m, Cluster(**H100)) == []


def test_ok_config_passes():
    """The reference config passes the table with no violation."""
    assert check(OK, MODEL, Cluster(**H100)) == []


@pytest.mark.parametrize("changes, cluster, code", CASES, ids=[c[2] for c in CASES])
def test_forbidden_combination_is_refused(changes, cluster, code):
    """Each forbidden combination is refused by its own row, with a source and a message saying what to
    change."""
    violations = check(OK.replace(**changes), MODEL, Cluster(**{**H100, **cluster}))
    codes = [v.code for v in violations]
    assert code in codes, codes
    v = next(v for v in violations if v.code == code)
    assert v.source and len(v.message) > 20


def test_enough_distinct_refusals_covered():
    """The cases cover at least 25 distinct rows, each a row of the table."""
    codes = {c[2] for c in CASES} | {c[1] for c in MODEL_CASES}
    assert len(codes) >= 25
    assert codes <= {r[0] for r in RULES}


def test_allowed_offload_passes():
    """Offloading core_attn with attn_proj and expert_fc1 with moe_act is accepted."""
    cfg = OK.replace(grouped_gemm=True, offload_modules=["core_attn", "attn_proj", "expert_fc1", "moe_act"])
    assert check(cfg, MODEL, Cluster(**H100)) == []


def test_mla_model_allows_mla_recompute():
    """mla_up_proj recompute is accepted on a multi-latent-attention model."""
    cfg = OK.replace(recompute_granularity="selective", recompute_modules=["mla_up_proj"])
    assert "mla_up_proj_without_mla" not in [v.code for v in check(cfg, MLA, Cluster(**H100))]


def test_allowed_overlap_and_graphs():
    """EP overlap with delayed wgrad, TE graphs of the dropless scopes and layernorm recompute are
    accepted together."""
    cfg = OK.replace(overlap_ep_a2a=True, delay_wgrad=True, cuda_graph_impl="transformer_engine",
                     cuda_graph_modules=["attn", "moe_router", "moe_preprocess"],
                     recompute_granularity="selective", recompute_modules=["layernorm"])
    assert check(cfg, MODEL, Cluster(**H100)) == []


@pytest.mark.parametrize("name", ["qwen3_235b", "qwen3_30b_a3b", "deepseek_v3", "mixtral_8x7b",
                                  "mixtral_8x22b", "moe_proxy"])
def test_shipped_baselines_pass(name):
    """Each shipped experiment's baseline passes the table on its own cluster."""
    e = load_experiment(name)
    assert check(e.baseline, e.model, e.cluster) == []


def test_batch_and_divisibility_messages_carry_the_numbers():
    """The rows whose fix is a number say the numbers: the global batch, micro batch and
    data-parallel size (with the GPUs and model parallelism it comes from, and a global batch that
    would divide); the GPU count against TP×PP×CP; experts against EP; heads against TP."""
    cluster = dict(H100)
    msg = {v.code: v.message for v in check(OK.replace(global_batch=60, micro_batch=2), MODEL, Cluster(**cluster))}
    # 16 GPUs / TP 2 = DP 8; micro batch 2 × 8 = 16, and 64 is the multiple of 16 nearest 60
    assert msg["global_batch_not_divisible"] == (
        "global batch 60 must be a multiple of micro batch 2 × data-parallel size 8 (= 16, from 16 GPUs / "
        "TP×PP×CP 2); e.g. global batch 64")
    msg = {v.code: v.message for v in check(OK.replace(tp=3), MODEL, Cluster(**cluster))}
    assert "TP×PP×CP = 3×1×1 = 3 must divide the GPU count 16" in msg["gpus_not_divisible"]
    assert msg["heads_not_divisible_by_tp"] == "attention heads (16) must be divisible by TP (3)"
    msg = {v.code: v.message for v in check(OK.replace(ep=3), MODEL, Cluster(**{**cluster, "gpus_per_node": 6, "nodes": 1}))}
    assert msg["experts_not_divisible_by_ep"] == "the number of experts (16) must be divisible by EP (3)"


def test_every_message_is_one_line_text():
    """Every refusal of the cases above is a non-empty line of text (a message made from the config
    renders, none is left a function)."""
    for changes, cluster, _ in CASES:
        for v in check(OK.replace(**changes), MODEL, Cluster(**{**H100, **cluster})):
            assert isinstance(v.message, str) and v.message and "\n" not in v.message, v.code


DEEPSEEK_LAYOUT = "Et*3|(tt|)*29m|L"


@pytest.mark.parametrize("changes", [
    {"pp": 8, "vpp": 4, "ep": 64, "pp_layout": DEEPSEEK_LAYOUT},  # vpp as the layout names it
    {"pp": 8, "ep": 64, "pp_layout": DEEPSEEK_LAYOUT},
    {"pp": 8, "ep": 64, "first_pp_layers": 6, "last_pp_layers": 7},
    {"pp": 16, "ep": 64, "first_pp_layers": 3, "last_pp_layers": 2},
], ids=["layout-vpp4", "layout", "first-last-pp8", "first-last-pp16"])
def test_nvidia_uneven_pipelines_pass_for_deepseek_v3(changes):
    """The uneven forms Megatron takes for DeepSeek-V3's 61 layers pass the table on its 1024 GPUs."""
    e = load_experiment("deepseek_v3")
    changes = {"first_pp_layers": None, "last_pp_layers": None, **changes}
    assert check(e.baseline.replace(**changes), e.model, e.cluster) == []


def test_qwen3_235b_embedding_and_loss_accounted_passes_and_even_pp8_does_not():
    """94 layers at PP 8 VPP 4 pass with the embedding and the loss counted (96 = 32 × 3); without
    them the message says the count and the forms that would split it."""
    e = load_experiment("qwen3_235b")
    assert check(e.baseline, e.model, e.cluster) == []
    (v,) = check(e.baseline.replace(account_for_embedding=False, account_for_loss=False), e.model, e.cluster)
    assert v.code == "layers_not_divisible_by_pp" and v.message.startswith("94 layers must split evenly over "
                                                                            "PP×VPP = 8×4 stages")


@pytest.mark.parametrize("changes, code", [
    ({"pp_layout": DEEPSEEK_LAYOUT, "first_pp_layers": 3}, "pipeline_split_conflict"),
    ({"first_pp_layers": 3, "last_pp_layers": 2, "account_for_loss": True}, "pipeline_split_conflict"),
    ({"pp_layout": DEEPSEEK_LAYOUT, "vpp": 2}, "pipeline_layout_vpp_conflict"),
    ({"pp_layout": "Et*3|(tt|)*29|L"}, "pipeline_layout_invalid"),
    ({"pp_layout": "Et;rm -rf|L"}, "pipeline_layout_invalid"),
])
def test_pipeline_split_refusals(changes, code):
    """Two forms of split at once, a VPP the layout contradicts, a layout that misses the MTP layer
    or holds characters no layout has: each refused by its own rule."""
    e = load_experiment("deepseek_v3")
    cfg = e.baseline.replace(**{"first_pp_layers": None, "last_pp_layers": None, "pp": 8, "ep": 64, **changes})
    assert code in [v.code for v in check(cfg, e.model, e.cluster)]


@pytest.mark.parametrize("model, code", [({"num_query_groups": 5}, "heads_not_divisible_by_query_groups"),
                                         ({"moe_router_topk": 32}, "topk_exceeds_experts")])
def test_model_shapes_megatron_cannot_build(model, code):
    """16 heads over 5 query groups, top-32 of 16 experts: refused, each by its rule."""
    from dataclasses import replace
    assert [v.code for v in check(OK.replace(tp=1, sequence_parallel=False), replace(MODEL, **model),
                                  Cluster(**H100))] == [code]


def test_megatron_fsdp_stands_in_for_the_distributed_optimizer():
    """Megatron FSDP turns the distributed optimizer on itself: the precision-aware optimizer and the
    overlapped parameter gather pass with FSDP and no --use-distributed-optimizer, and are refused
    without either."""
    cfg = OK.replace(distributed_optimizer=False, precision_aware_optimizer=True, overlap_grad_reduce=True,
                     overlap_param_gather=True)
    codes = [v.code for v in check(cfg, MODEL, Cluster(**H100))]
    assert codes == ["precision_aware_needs_distopt", "param_gather_overlap_needs_distopt"]
    assert check(cfg.replace(fsdp=True), MODEL, Cluster(**H100)) == []


def test_megatron_fsdp_with_pipeline_and_each_strategy_passes():
    """FSDP with PP, VPP, CP, TP and EP overlap (graphs off or of the whole iteration), and every
    sharding strategy Megatron has, passes the table: Megatron takes them all."""
    for changes in ({"pp": 2}, {"pp": 2, "vpp": 2}, {"cp": 2, "global_batch": 32},
                    {"overlap_ep_a2a": True}, *({"fsdp_sharding": s} for s in FSDP_SHARDING)):
        assert check(OK.replace(fsdp=True, **changes), MODEL, Cluster(**H100)) == [], changes
