"""Activations a layer keeps for backward, counted tensor by tensor as Megatron-Core 0.19 keeps them
with Transformer Engine (TE linear layers, fused attention), grouped GEMM experts (TEGroupedMLP)
and the alltoall token dispatcher, for one micro batch on one GPU, in bytes.

Read from megatron/core/transformer/moe (token_dispatcher.py, experts.py, moe_utils.py, router.py,
moe_layer.py), multi_latent_attention.py and attention.py of megatron-core 0.19.2; Transformer
Engine is not installed beside it, so TE's side is from its public source (GroupedLinear saves its
input for the weight gradient; fused attention saves Q, K, V, the output and the softmax
statistics). A tensor two modules save (a linear layer's input that a norm produced, the attention
output the projection takes) is counted once: they share one storage. Copies that no backward needs
(the tokens permuted before the all-to-all, the all-to-all's output when a second permutation sorts
it, the expert output on its way back) are freed when the layer returns; one layer's worth of them
is `moe_transient_bytes`. The flex dispatcher (DeepEP, HybridEP) saves the same: it permutes the
received tokens with the same permute before the same grouped experts; only its working copies
differ.
"""
from __future__ import annotations

from moetune.experiment.config import TrainingConfig
from moetune.experiment.model import ModelArch

BF16, FP32, INT64, MASK = 2, 4, 8, 1
# Megatron's hidden dropout (0.1 by default; moetune does not change it) keeps a one-byte mask of
# each bias-dropout-add output. Fused attention draws its dropout from a saved RNG state instead.
HIDDEN_DROPOUT = True
# Megatron's attention dropout where the model does not set it (ModelArch.attention_dropout)
ATTENTION_DROPOUT = 0.1


def _tokens(m: ModelArch, c: TrainingConfig) -> tuple[float, float]:
    """(tokens of one micro batch on this rank's sequence, the same split by sequence parallelism)."""
    tok = (c.seq_length or m.seq_length) / c.cp * c.micro_batch
    return tok, tok / (c.tp if c.sequence_parallel else 1)


def modules(c: TrainingConfig) -> set[str]:
    """The recomputed and the offloaded modules together (both free what they name)."""
    return set(c.recompute_modules) | set(c.offload_modules)


def residual_bytes(m: ModelArch, c: TrainingConfig, moe: bool) -> float:
    """The hidden-width tensors around attention and the MLP: the two norms' inputs (the residual
    stream) and outputs, and the two dropout masks."""
    return sum(_residual_parts(m, c, moe).values())


def _residual_parts(m: ModelArch, c: TrainingConfig, moe: bool) -> dict[str, float]:
    """residual_bytes' tensors by name: ln1_in, ln1_out, ln2_in, ln2_out, masks."""
    _, tsp = _tokens(m, c)
    h = m.hidden_size
    mods = modules(c)
    ln1_in = BF16 * tsp * h  # input norm's input: the layer's input
    # input norm's output, the QKV projection's input (fused into TE's LayerNormLinear, except
    # under MLA, whose down-projections follow a separate norm that layernorm recompute redoes)
    mla_norm = m.multi_latent_attention and bool({"layernorm", "attn_norm"} & set(c.recompute_modules))
    ln1_out = 0 if ("qkv_linear" in c.offload_modules or mla_norm) else BF16 * tsp * h
    ln2_in = BF16 * tsp * h  # pre-MLP norm's input: the residual after attention
    if moe:  # a separate norm (router, experts and shared experts take its output)
        ln2_out = 0 if {"layernorm", "mlp_norm"} & mods else BF16 * tsp * h
    else:  # fused into the dense MLP's fc1 (LayerNormLinear), which keeps it unless the MLP is redone
        ln2_out = 0 if "mlp" in mods else BF16 * tsp * h
    masks = 2 * MASK * tsp * h if HIDDEN_DROPOUT else 0
    return {"ln1_in": ln1_in, "ln1_out": ln1_out, "ln2_in": ln2_in, "ln2_out": ln2_out, "masks": masks}


def attention_bytes(m: ModelArch, c: TrainingConfig) -> float:
    """Self-attention (GQA or MLA) under TE: what the projections and the core attention keep."""
    if m.multi_latent_attention:
        return mla_bytes(m, c)
    tok, _ = _tokens(m, c)
    mods = modules(c)
    d = m.kv_channels or m.hidden_size // m.num_attention_heads
    q = m.num_attention_heads * d / c.tp
    k = m.num_query_groups * d / c.tp
    qkv = BF16 * tok * (q + 2 * k)  # Q and K after RoPE, V: the fused attention's inputs
    # QK norm: each norm keeps its input, Q and K as the QKV projection produced them
    qk_norm = BF16 * tok * (q + k) if m.qk_layernorm else 0
    out = 0 if "attn_proj" in c.offload_modules else BF16 * tok * q  # attention output = projection input
    # softmax statistics (log-sum-exp, fp32 a head and query); core_attn recompute keeps its
    # inputs Q, K, V and the output all the same, so under fused attention it frees only these
    stats = 0 if "core_attn" in mods else FP32 * tok * m.num_attention_heads / c.tp
    # A sliding window or learnable sinks change none of these under fused attention: the window
    # masks scores it never stores, the sinks are one parameter a head (but see unfused_share).
    return qkv + qk_norm + out + stats + attention_scores_bytes(m, c)


def mla_bytes(m: ModelArch, c: TrainingConfig) -> float:
    """Multi-latent attention (DeepSeek-V2/V3, Kimi-K2) under TE, sequence parallel: the compressed
    latents (the down-projections are not split by TP), then Q, K, V of every head."""
    tok, tsp = _tokens(m, c)
    mods = modules(c)
    rq, rkv, rope = m.q_lora_rank or 0, m.kv_lora_rank or 0, m.qk_pos_emb_head_dim or 0
    n = m.num_attention_heads / c.tp
    dq, dv = (m.qk_head_dim or 0) + rope, m.v_head_dim or 0
    q_latent = 2 * BF16 * tsp * rq  # q down-projection's output (its norm's input) and the norm's output
    # kv down-projection's output (the latent and the shared RoPE key: the norm keeps a view of
    # it) and the normed latent the kv up-projection keeps
    kv_latent = BF16 * tsp * (rkv + rope) + BF16 * tsp * rkv
    if "mla_up_proj" in mods:  # the up-projections are redone: Q, K, V dropped after attention,
        qkv = BF16 * tok * rope  # the checkpoint keeps the RoPE key gathered over the sequence
    else:  # Q = [q, q_rope], K = [k, k_rope] and V, made contiguous for the fused attention
        qkv = BF16 * tok * n * (2 * dq + dv)
    out = 0 if "attn_proj" in c.offload_modules else BF16 * tok * n * dv
    stats = 0 if "core_attn" in mods else FP32 * tok * n
    return q_latent + kv_latent + qkv + out + stats + attention_scores_bytes(m, c)


def unfused_share(m: ModelArch, c: TrainingConfig) -> float:
    """The share of layers whose attention runs unfused, keeping the score matrix. All of them under
    Megatron's local attention. Under TE, its backend selection (get_attention_backend) rules out
    flash attention for a softmax offset (sinks) and cuDNN's fused attention for a sliding window
    with dropout, so a model with sinks and attention dropout runs its windowed layers on TE's
    unfused attention (GPT-OSS at Megatron's default dropout: every other layer; its fit died in
    TE's unfused softmax). Its own config's dropout, 0, leaves them to cuDNN."""
    if c.transformer_impl == "local":
        return 1.0
    dropout = ATTENTION_DROPOUT if m.attention_dropout is None else m.attention_dropout
    if m.softmax_type != "vanilla" and m.window_size and dropout:
        return m.window_layers() / m.num_layers
    return 0.0


def attention_scores_bytes(m: ModelArch, c: TrainingConfig) -> float:
    """Unfused attention keeps the score matrix for backward, per head and query-key pair (it
    builds the whole matrix and masks it, window or not). Megatron's local attention: softmax
    output (2 B), dropout mask (1 B) and dropout output (2 B), 5·a·s²·b (Korthikanti et al. 2022,
    Table 2). TE's unfused attention takes the softmax in fp32 and keeps that output (4 B) beside
    the mask and the dropout output: 7 B. Fused attention keeps none of it. An average over the
    layers (unfused_share), since the estimate prices a layer kind, not each layer."""
    share = unfused_share(m, c)
    if not share or "core_attn" in modules(c):
        return 0.0
    s = (c.seq_length or m.seq_length) / c.cp
    per_score = 5 if c.transformer_impl == "local" else FP32 + MASK + BF16
    return share * per_score * (m.num_attention_heads / c.tp) * s * s * c.micro_batch


def dense_mlp_bytes(m: ModelArch, c: TrainingConfig, ffn: int | None = None) -> float:
    """A gated dense MLP (its input is the norm output residual_bytes counts): fc1's output, which
    the activation keeps, and the activation's output, which fc2 keeps; none of it under `mlp` recompute."""
    return 0.0 if "mlp" in modules(c) else _gated_mlp_bytes(m, c, ffn or m.ffn_hidden_size)


def _gated_mlp_bytes(m: ModelArch, c: TrainingConfig, ffn: int) -> float:
    """fc1's output (gate and up halves) and the activation's output of a TP-split gated MLP."""
    tok, _ = _tokens(m, c)
    f = ffn / c.tp
    return BF16 * tok * 2 * f + BF16 * tok * f


def routed_tokens(m: ModelArch, c: TrainingConfig) -> float:
    """Token copies an expert-parallel rank's experts take in one micro batch, balanced: each of
    its sequence-parallel tokens top-k times, padded to the capacity where it is padded, and
    gathered over the expert-tensor-parallel group."""
    _, tsp = _tokens(m, c)
    pad = c.capacity_factor if c.capacity_factor and c.pad_to_capacity else 1.0
    return tsp * m.moe_router_topk * pad * (c.etp or c.tp)


def router_bytes(m: ModelArch, c: TrainingConfig) -> float:
    """The router's saved tensors (the score functions compute in fp32 whatever the router's dtype;
    no aux or z-loss, whose coefficients moetune leaves at Megatron's 0, so the logits themselves
    are not kept): the scores, the top-k's indices, the permutation's indices of tokens and probabilities."""
    _, tsp = _tokens(m, c)
    k, E = m.moe_router_topk, m.num_experts
    if m.moe_router_score_function == "sigmoid":  # sigmoid of every expert's logit, then normalised
        scores = FP32 * tsp * (E + 2 * k)
    elif m.moe_router_pre_softmax:  # softmax over every expert, then top-k of it
        scores = FP32 * tsp * E
    else:  # top-k of the logits, softmax over the k chosen
        scores = FP32 * tsp * k
    indices = 3 * INT64 * tsp * k  # top-k's, and the permutation's for the tokens and the probabilities
    dropped = MASK * tsp * E if c.capacity_factor else 0  # the capacity mask that multiplies the probs
    return scores + indices + dropped


def moe_bytes(m: ModelArch, c: TrainingConfig) -> float:
    """A MoE layer's MLP side (its input is the norm output residual_bytes counts): router, routed
    experts, shared experts."""
    mods = modules(c)
    if "moe" in c.recompute_modules:  # the checkpoint keeps only its input, the norm's output
        return 0.0
    tok, tsp = _tokens(m, c)
    t = routed_tokens(m, c)
    f = m.moe_ffn_hidden_size / (c.etp or c.tp)
    fc1_in = 0 if "expert_fc1" in c.offload_modules else BF16 * t * m.hidden_size  # sorted tokens, fc1's input
    fc1_out = 0 if "moe_act" in c.offload_modules else BF16 * t * 2 * f  # the activation's input
    act = 0 if "moe_act" in c.recompute_modules else BF16 * t * f  # the activation's output, fc2's input
    probs = FP32 * t  # each copy's routing weight, which the weighted activation keeps
    shared = 0.0
    if m.moe_shared_expert_intermediate_size and "shared_experts" not in mods:
        shared = _gated_mlp_bytes(m, c, m.moe_shared_expert_intermediate_size)
        if m.moe_shared_expert_gate:  # the shared output the sigmoid gate multiplies
            shared += BF16 * tsp * m.hidden_size
    return fc1_in + fc1_out + act + probs + router_bytes(m, c) + shared


def moe_transient_bytes(m: ModelArch, c: TrainingConfig) -> float:
    """Token copies one MoE layer holds while it runs and frees when it returns, once a stage (not
    per micro batch in flight): under the alltoall dispatcher the tokens permuted for the
    all-to-all, its output (the experts' input itself when one expert is local), the experts' output
    and the combining all-to-all's result. Counted so for every dispatcher, as the layout search
    takes a layout's dispatchers to need the same memory (estimate/space.py): flex (DeepEP,
    HybridEP) holds one copy fewer (it receives a token once a rank, and its buffers are outside
    PyTorch's allocator), allgather the expert-parallel group's tokens twice instead."""
    if "moe" in c.recompute_modules:
        return 0.0
    return (4 if m.num_experts // c.ep > 1 else 3) * BF16 * routed_tokens(m, c) * m.hidden_size


def layer_bytes(m: ModelArch, c: TrainingConfig, moe: bool) -> float:
    """One layer, one micro batch, on one GPU, selective recompute and offload applied."""
    mlp = moe_bytes(m, c) if moe else dense_mlp_bytes(m, c)
    return residual_bytes(m, c, moe) + attention_bytes(m, c) + mlp


def graphed_bytes(m: ModelArch, c: TrainingConfig, moe: bool) -> float:
    """What one layer's CUDA-graphed scopes keep for backward, one micro batch: the tensors a graph's
    replay writes into its private pool rather than the regular one, recompute applied. attn: the
    input norm's input and output, the attention's saved tensors and its output to the residual
    (the next norm's input); moe_router: the pre-MLP norm's output and the router's tensors, the
    shared experts' too where they are not overlapped (Megatron graphs them with the router then);
    moe_preprocess: only token counts; mlp and moe: the MLP side whole. No scopes, or a whole
    iteration: the layer."""
    if c.cuda_graph_impl in (None, "none"):
        return 0.0
    if c.cuda_graph_impl == "full_iteration" or not c.cuda_graph_modules:
        return layer_bytes(m, c, moe)
    r = _residual_parts(m, c, moe)
    scopes = set(c.cuda_graph_modules)
    out = 0.0
    if "attn" in scopes:
        out += r["ln1_in"] + r["ln1_out"] + r["ln2_in"] + attention_bytes(m, c)
    if moe and "moe" in scopes:
        out += r["ln2_out"] + moe_bytes(m, c)
    elif moe and "moe_router" in scopes:
        out += r["ln2_out"] + router_bytes(m, c)
        if m.moe_shared_expert_intermediate_size and not c.shared_expert_overlap:
            out += _gated_mlp_bytes(m, c, m.moe_shared_expert_intermediate_size)
    elif not moe and "mlp" in scopes:
        out += dense_mlp_bytes(m, c)
    return out


def logits_bytes(m: ModelArch, c: TrainingConfig, vocab: int) -> float:
    """The output layer on the last stage: the final norm's input and output, the fp32 softmax the
    vocab-parallel cross entropy keeps, and the bf16 logits alive beside it while the loss runs."""
    tok, tsp = _tokens(m, c)
    return 2 * BF16 * tsp * m.hidden_size + (FP32 + BF16) * tok * vocab / c.tp


def mtp_bytes(m: ModelArch, c: TrainingConfig, vocab: int) -> float:
    """Each multi-token-prediction layer: the next tokens' embedding and the hidden state, each
    normed, their concatenation (the projection's input), a MoE layer, and its own loss, computed
    before the main one (Megatron's process_mtp_loss), which keeps its fp32 softmax and the final
    norm's input and output; its bf16 logits are gone when that returns."""
    tok, tsp = _tokens(m, c)
    h = m.hidden_size
    inputs = BF16 * tsp * (h + h + 2 * h) + BF16 * tsp * h  # two norm outputs, the concatenation, the embedding
    loss = 2 * BF16 * tsp * h + FP32 * tok * vocab / c.tp
    return m.mtp_num_layers * (inputs + layer_bytes(m, c, moe=True) + loss)


def embedding_bytes(m: ModelArch, c: TrainingConfig) -> float:
    """The first stage's embedding dropout mask (its output is the first layer's input)."""
    _, tsp = _tokens(m, c)
    return MASK * tsp * m.hidden_size if HIDDEN_DROPOUT else 0.0
