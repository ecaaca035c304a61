"""estimate/activations.py: each activation term is the tensor Megatron-Core keeps, so switching a
module's recompute or offload, or an architecture feature, moves the count by exactly that tensor."""
import pytest

from moetune.estimate import activations as act
from moetune.estimate.memory import estimate
from moetune.experiment.model import ModelArch
from moetune.experiment.schema import load_experiment


def _qwen():
    e = load_experiment("qwen3_30b_a3b")
    return e.model, e.baseline


def test_moe_act_recompute_frees_exactly_the_activation_output():
    """Recomputing moe_act drops fc2's input, the activation's output (routed copies x moe_ffn, bf16);
    fc1's output stays, the checkpoint's input."""
    m, c = _qwen()
    on = c.replace(recompute_granularity="selective", recompute_modules=("moe_act",))
    freed = act.layer_bytes(m, c, moe=True) - act.layer_bytes(m, on, moe=True)
    assert freed == 2 * act.routed_tokens(m, c) * m.moe_ffn_hidden_size
    # offloading moe_act moves fc1's output, twice as wide (gate and up halves), and not the same tensor
    off = c.replace(offload_modules=("moe_act",))
    assert act.layer_bytes(m, c, moe=True) - act.layer_bytes(m, off, moe=True) == 2 * freed


def test_layernorm_recompute_frees_the_pre_mlp_norm_output_only():
    """Under TE the input norm is fused into the QKV projection; layernorm recompute redoes the MoE
    layer's separate pre-MLP norm: one hidden-width bf16 tensor of the sequence-parallel tokens."""
    m, c = _qwen()
    on = c.replace(recompute_granularity="selective", recompute_modules=("layernorm",))
    tokens = (c.seq_length or m.seq_length) * c.micro_batch / c.tp
    assert act.layer_bytes(m, c, moe=True) - act.layer_bytes(m, on, moe=True) == 2 * tokens * m.hidden_size
    assert act.layer_bytes(m, on, moe=False) == act.layer_bytes(m, c, moe=False)  # dense: fused, nothing


def test_routed_tokens_are_kept_once_not_per_copy_made():
    """Of the routed copies (permuted, dispatched, sorted) only the experts' input is saved: the
    layer's count grows by one hidden-width copy per routed token when top-k grows, plus the
    activation's tensors, not by three."""
    m, c = _qwen()
    wider = ModelArch(**{**m.to_dict(), "moe_router_topk": 2 * m.moe_router_topk})
    per_copy = act.moe_bytes(wider, c) - act.moe_bytes(m, c)
    t = act.routed_tokens(m, c)
    expected_experts = t * (2 * m.hidden_size + 2 * 2 * m.moe_ffn_hidden_size + 2 * m.moe_ffn_hidden_size + 4)
    router = act.router_bytes(wider, c) - act.router_bytes(m, c)
    assert per_copy == pytest.approx(expected_experts + router)
    # the working copies freed when the layer returns are counted once a stage, not per micro batch:
    # alltoall permutes before and sorts after the exchange (one copy fewer with one local expert)
    assert act.moe_transient_bytes(m, c) == 4 * 2 * t * m.hidden_size
    single = c.replace(ep=m.num_experts)
    assert act.moe_transient_bytes(m, single) == 3 * 2 * act.routed_tokens(m, single) * m.hidden_size
    flex = c.replace(dispatcher="flex", flex_backend="deepep")  # flex saves the same tensors
    assert act.moe_bytes(m, flex) == act.moe_bytes(m, c)


def test_sliding_window_or_sinks_alone_keep_the_same_activations_under_fused_attention():
    """A sliding window masks scores fused attention never stores; a learnable sink is a parameter.
    Either alone changes nothing a layer saves (nor, unfused, the full score matrix local attention
    builds)."""
    m, c = _qwen()
    for change in ({"window_size": 128, "window_attn_skip_freq": 2}, {"softmax_type": "learnable"}):
        other = ModelArch(**{**m.to_dict(), **change})
        assert act.attention_bytes(other, c) == act.attention_bytes(m, c)
    local = c.replace(transformer_impl="local")
    windowed = ModelArch(**{**m.to_dict(), "window_size": 128})
    assert act.attention_bytes(windowed, local) == act.attention_bytes(m, local) > act.attention_bytes(m, c)


def test_sinks_with_a_window_run_the_windowed_layers_unfused():
    """Sinks rule out flash attention, a window with dropout cuDNN's fused attention: the windowed
    layers (every other with a skip frequency of 2) keep TE's unfused score matrix, fp32 softmax,
    dropout mask and output (7 B a score), averaged over the layers; core_attn recompute drops it."""
    m, c = _qwen()
    gpt_like = ModelArch(**{**m.to_dict(), "window_size": 128, "window_attn_skip_freq": 2,
                            "softmax_type": "learnable"})
    s = c.seq_length or m.seq_length
    scores = m.num_attention_heads / c.tp * s * s * c.micro_batch
    assert act.unfused_share(gpt_like, c) == 0.5
    assert act.attention_bytes(gpt_like, c) - act.attention_bytes(m, c) == 0.5 * 7 * scores
    redo = c.replace(recompute_granularity="selective", recompute_modules=("core_attn",))
    assert act.attention_scores_bytes(gpt_like, redo) == 0


def test_qk_norm_keeps_the_unnormed_query_and_key():
    """QK layernorm keeps its inputs: one more query-width and one more key-width tensor."""
    m, c = _qwen()
    plain = ModelArch(**{**m.to_dict(), "qk_layernorm": False})
    tokens = (c.seq_length or m.seq_length) * c.micro_batch
    d = m.kv_channels or m.hidden_size // m.num_attention_heads
    width = (m.num_attention_heads + m.num_query_groups) * d / c.tp
    assert act.attention_bytes(m, c) - act.attention_bytes(plain, c) == 2 * tokens * width


def test_mla_up_proj_recompute_drops_the_per_head_q_k_v():
    """DeepSeek-V3: recomputing MLA's up-projections frees Q, K, V of every head (2·(qk+rope) + v
    per head), keeping the compressed latents and the gathered RoPE key; the latents are not split
    by TP, so they do not shrink with it."""
    e = load_experiment("deepseek_v3")
    m, c = e.model, e.baseline.replace(recompute_granularity=None, recompute_modules=())
    on = c.replace(recompute_granularity="selective", recompute_modules=("mla_up_proj",))
    tokens = (c.seq_length or m.seq_length) * c.micro_batch
    heads = m.num_attention_heads / c.tp
    qkv = 2 * tokens * heads * (2 * (m.qk_head_dim + m.qk_pos_emb_head_dim) + m.v_head_dim)
    assert act.mla_bytes(m, c) - act.mla_bytes(m, on) == qkv - 2 * tokens * m.qk_pos_emb_head_dim
    latents = act.mla_bytes(m, on) - act.mla_bytes(m, on.replace(recompute_modules=("mla_up_proj", "attn_proj")))
    assert latents == 0  # attn_proj is an offload module: recomputing it frees nothing


def test_last_stage_carries_the_loss_and_mtp():
    """The loss (fp32 softmax and bf16 logits over the vocabulary shard) and the MTP layer sit on the
    last stage: its estimate minus the same layers priced without them is exactly those terms."""
    e = load_experiment("deepseek_v3")
    m, c = e.model, e.baseline
    last = estimate(m, c, e.cluster.gpus, stage=c.pp - 1).activations_gb
    bare = ModelArch(**{**m.to_dict(), "mtp_num_layers": 0})
    no_mtp = estimate(bare, c, e.cluster.gpus, stage=c.pp - 1).activations_gb
    from moetune.estimate.memory import GB, padded_vocab
    assert (last - no_mtp) * GB == pytest.approx(act.mtp_bytes(m, c, padded_vocab(m, c.tp)))
    tokens = (c.seq_length or m.seq_length) * c.micro_batch
    assert act.logits_bytes(m, c, 1000) - act.logits_bytes(m, c, 0) == 6 * tokens * 1000 / c.tp


def test_expert_tensor_parallelism_gathers_tokens_and_splits_the_ffn():
    """ETP 2 (TP 2, SP): the expert-TP group gathers its tokens, so fc1's input (hidden-wide) doubles
    while fc1's output and the activation (ffn/ETP wide) keep their size."""
    m, c = _qwen()
    one = c.replace(tp=2, sequence_parallel=True, etp=1)
    two = one.replace(etp=2)
    assert act.routed_tokens(m, two) == 2 * act.routed_tokens(m, one)
    grown = act.moe_bytes(m, two) - act.moe_bytes(m, one)
    t = act.routed_tokens(m, one)
    assert grown == pytest.approx(2 * t * m.hidden_size + 4 * t)  # one more hidden-wide copy, its weight


def test_gpt_oss_own_attention_dropout_leaves_its_windowed_layers_fused():
    """GPT-OSS's config sets attention dropout 0: with sinks and a window TE's cuDNN attention
    takes its windowed layers and nothing keeps a score matrix; at Megatron's default dropout
    (0.1, as its fit ran) every windowed layer runs unfused and keeps one."""
    from pathlib import Path

    from moetune.estimate.activations import unfused_share
    from moetune.experiment.config import TrainingConfig
    from moetune.experiment.hf_import import model_from_hf, read_config
    path = Path(__file__).resolve().parents[1] / "data" / "hf_configs" / "gpt_oss_120b.json"
    m = model_from_hf(read_config(path), "gpt_oss_120b")
    c = TrainingConfig(transformer_impl="transformer_engine")
    assert m.attention_dropout == 0.0 and unfused_share(m, c) == 0.0
    default = m.__class__(**{**m.to_dict(), "attention_dropout": None})
    assert unfused_share(default, c) == default.window_layers() / default.num_layers > 0
    assert "--attention-dropout" in m.to_args() and "--attention-dropout" not in default.to_args()


def test_graphed_scopes_keep_their_own_tensors():
    """CUDA graphs' pools hold what the graphed scopes save: nothing without graphs; attention's
    tensors and three hidden-width norms' for attn; the pre-MLP norm's output and the router's for
    moe_router (preprocess adds none); the whole layer for graphs without scopes."""
    m, c = _qwen()
    norm = 2 * (c.seq_length or m.seq_length) * c.micro_batch / c.tp * m.hidden_size
    te = c.replace(cuda_graph_impl="transformer_engine")
    assert act.graphed_bytes(m, c, moe=True) == 0
    attn = act.graphed_bytes(m, te.replace(cuda_graph_modules=("attn",)), moe=True)
    assert attn == 3 * norm + act.attention_bytes(m, c)
    rp = act.graphed_bytes(m, te.replace(cuda_graph_modules=("moe_router", "moe_preprocess")), moe=True)
    assert rp == act.graphed_bytes(m, te.replace(cuda_graph_modules=("moe_router",)), moe=True)
    assert rp == norm + act.router_bytes(m, c) < attn
    assert act.graphed_bytes(m, te.replace(cuda_graph_modules=("attn", "moe_router")), moe=True) == attn + rp
    assert act.graphed_bytes(m, te, moe=True) == act.layer_bytes(m, c, moe=True)
    # layernorm recompute: the pre-MLP norm's output is not kept, inside the router's graph either
    ln = te.replace(cuda_graph_modules=("moe_router",), recompute_granularity="selective",
                    recompute_modules=("layernorm",))
    assert act.graphed_bytes(m, ln, moe=True) == rp - norm


def test_graph_pools_follow_the_micro_batches_in_flight():
    """The estimate's graph pools: none without graphs; at PP 1 one micro-batch's (Megatron captures
    one), at PP 2 the first stage's two in flight; they add to the total."""
    from moetune.estimate.memory import CUDA_GRAPH_FIXED_GB, CUDA_GRAPH_POOL_FACTOR, GB, graphed_saved_bytes
    m, c = _qwen()
    c = c.replace(pp=1, vpp=None, ep=8, global_batch=64)
    graphed = c.replace(cuda_graph_impl="transformer_engine", cuda_graph_modules=("attn", "moe_router"))
    plain, pools = estimate(m, c, 16), estimate(m, graphed, 16)
    assert plain.cuda_graphs_gb == 0 and pools.cuda_graphs_gb > CUDA_GRAPH_FIXED_GB
    assert pools.total_gb - plain.total_gb == pytest.approx(pools.cuda_graphs_gb)
    one = graphed_saved_bytes(m, graphed, 0, m.num_layers, 1)
    two = estimate(m, graphed.replace(pp=2), 32)
    # half the layers a stage, twice the micro-batches in flight: the same saved tensors
    assert two.cuda_graphs_gb == pytest.approx(pools.cuda_graphs_gb, rel=1e-9)
    assert pools.cuda_graphs_gb - CUDA_GRAPH_FIXED_GB == pytest.approx(CUDA_GRAPH_POOL_FACTOR * one / GB)
