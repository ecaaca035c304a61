"""The model architecture of an experiment, and the Megatron arguments that describe it."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Annotated, Literal

from pydantic import ConfigDict, Field

# The bounds an experiment's model section is validated against (experiment/schema.py reads this
# class as the section's schema, so its fields live here only).
Positive = Annotated[int, Field(gt=0)]


@dataclass(frozen=True)
class ModelArch:
    """A transformer MoE as Megatron-LM sees it. Sizes are the published ones of each model."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    name: str
    num_layers: Positive
    hidden_size: Positive
    num_attention_heads: Positive
    num_query_groups: Positive
    ffn_hidden_size: Positive  # dense layers (and the first dense layers of DeepSeek-V3)
    moe_ffn_hidden_size: Positive
    num_experts: Annotated[int, Field(gt=1)]
    moe_router_topk: Positive
    vocab_size: Positive
    seq_length: Positive
    kv_channels: int | None = None  # head dim, where it is not hidden/heads
    moe_shared_expert_intermediate_size: int | None = None
    first_dense_layers: Annotated[int, Field(ge=0)] = 0  # leading layers with a dense MLP (DeepSeek-V3: 3)
    # 1 a MoE layer, 0 a dense one, for each layer, where dense layers are not all leading
    moe_layer_pattern: tuple[Annotated[int, Field(ge=0, le=1)], ...] | None = None
    qk_layernorm: bool = False
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_head_dim: int | None = None
    qk_pos_emb_head_dim: int | None = None
    v_head_dim: int | None = None
    rotary_base: int = 10000
    moe_router_score_function: Literal["softmax", "sigmoid"] = "softmax"  # DeepSeek-V3: sigmoid
    mtp_num_layers: Annotated[int, Field(ge=0)] = 0
    untie_embeddings: bool = True
    # DeepSeek-V3's router: node-limited (grouped) top-k, scaled weights, aux-loss-free bias
    moe_router_num_groups: Annotated[int, Field(gt=0)] | None = None
    moe_router_group_topk: Annotated[int, Field(gt=0)] | None = None
    moe_router_topk_scaling_factor: Annotated[float, Field(gt=0)] | None = None
    moe_router_enable_expert_bias: bool = False
    moe_router_pre_softmax: bool = False  # softmax over all experts before top-k, not renormalised (Qwen2-MoE)
    moe_shared_expert_gate: bool = False  # a sigmoid gate on the shared expert's output (Qwen2-MoE)
    add_qkv_bias: bool = False  # biases on the Q, K, V projections only (Qwen2-MoE, GLM-4.5)
    rotary_percent: Annotated[float, Field(gt=0, le=1)] = 1.0  # share of a head's dims RoPE turns (GLM-4.5: 0.5)
    # GPT-OSS: sliding-window attention on some layers, attention sinks, biases, a clamped GLU
    window_size: Annotated[int, Field(gt=0)] | None = None  # keys back a sliding-window layer attends
    window_attn_skip_freq: Annotated[int, Field(gt=0)] | None = None  # every Nth layer full attention; None: none
    softmax_type: Literal["vanilla", "off-by-one", "learnable"] = "vanilla"  # learnable: a sink per head
    add_bias_linear: bool = False  # biases in every linear layer (attention and MLPs)
    activation: Literal["swiglu", "quick_geglu"] = "swiglu"  # the gated MLP's activation
    glu_linear_offset: float = 0.0  # added to the GLU's linear half (GPT-OSS: 1)
    activation_func_clamp_value: Annotated[float, Field(gt=0)] | None = None  # GLU inputs clamped (GPT-OSS: 7)
    # dropout on the attention probabilities; None: Megatron's default, 0.1 (with a sliding window
    # it decides whether TE's fused attention runs, and so what attention keeps: estimate/activations.py)
    attention_dropout: Annotated[float, Field(ge=0, lt=1)] | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["moe_layer_pattern"] is not None:  # a list, as YAML and JSON write it
            d["moe_layer_pattern"] = list(d["moe_layer_pattern"])
        return d

    @classmethod
    def from_dict(cls, data: dict) -> ModelArch:
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        if data.get("moe_layer_pattern") is not None:
            data["moe_layer_pattern"] = tuple(data["moe_layer_pattern"])
        return cls(**data)

    @classmethod
    def from_args(cls, argv: list[str], name: str = "from-args") -> ModelArch:
        """The architecture named by a Megatron argv (the flags `to_args` writes); inverse of it."""
        def val(flag, cast=int, default=None):
            if flag in argv:
                i = argv.index(flag)
                if i + 1 < len(argv):
                    try:
                        return cast(argv[i + 1])
                    except ValueError:
                        what = "a whole number" if cast is int else "a number" if cast is float else cast.__name__
                        raise ValueError(f"{flag} {argv[i + 1]}: not {what}") from None
            return default
        heads = val("--num-attention-heads", default=1)
        pattern = parse_layer_pattern(val("--moe-layer-freq", str) or "", val("--num-layers", default=1))
        first = pattern.index(1) if pattern and 1 in pattern else 0
        leading = pattern is None or pattern == [0] * first + [1] * (len(pattern) - first)
        ffn = val("--ffn-hidden-size", default=1)
        return cls(
            name=name, num_layers=val("--num-layers", default=1), hidden_size=val("--hidden-size", default=1),
            num_attention_heads=heads, num_query_groups=val("--num-query-groups", default=heads),
            ffn_hidden_size=ffn, moe_ffn_hidden_size=val("--moe-ffn-hidden-size", default=ffn),
            num_experts=val("--num-experts", default=2), moe_router_topk=val("--moe-router-topk", default=2),
            vocab_size=val("--vocab-size", default=32000), seq_length=val("--seq-length", default=4096),
            kv_channels=val("--kv-channels"),
            moe_shared_expert_intermediate_size=val("--moe-shared-expert-intermediate-size"),
            first_dense_layers=first if leading else 0,
            moe_layer_pattern=None if leading or pattern is None else tuple(pattern),
            qk_layernorm="--qk-layernorm" in argv,
            multi_latent_attention="--multi-latent-attention" in argv,
            q_lora_rank=val("--q-lora-rank"), kv_lora_rank=val("--kv-lora-rank"),
            qk_head_dim=val("--qk-head-dim"), qk_pos_emb_head_dim=val("--qk-pos-emb-head-dim"),
            v_head_dim=val("--v-head-dim"), rotary_base=val("--rotary-base", default=10000),
            moe_router_score_function=val("--moe-router-score-function", str, "softmax"),
            mtp_num_layers=val("--mtp-num-layers", default=0),
            untie_embeddings="--untie-embeddings-and-output-weights" in argv,
            moe_router_num_groups=val("--moe-router-num-groups"),
            moe_router_group_topk=val("--moe-router-group-topk"),
            moe_router_topk_scaling_factor=val("--moe-router-topk-scaling-factor", float),
            moe_router_enable_expert_bias="--moe-router-enable-expert-bias" in argv,
            moe_router_pre_softmax="--moe-router-pre-softmax" in argv,
            moe_shared_expert_gate="--moe-shared-expert-gate" in argv, add_qkv_bias="--add-qkv-bias" in argv,
            rotary_percent=val("--rotary-percent", float, 1.0),
            window_size=int(str(val("--window-size", str, "0")).strip("()").split(",")[0]) or None,
            window_attn_skip_freq=val("--window-attn-skip-freq"),
            softmax_type=val("--softmax-type", str, "vanilla"),
            add_bias_linear="--disable-bias-linear" not in argv,
            activation="quick_geglu" if "--quick-geglu" in argv else "swiglu",
            glu_linear_offset=val("--glu-linear-offset", float, 0.0),
            activation_func_clamp_value=val("--activation-func-clamp-value", float),
            attention_dropout=val("--attention-dropout", float))

    @property
    def moe_layers(self) -> int:
        return sum(self.layer_kinds())

    def layer_kinds(self) -> list[int]:
        """1 for each MoE layer, 0 for each dense one, in order."""
        if self.moe_layer_pattern is not None:
            return list(self.moe_layer_pattern)
        return [0] * self.first_dense_layers + [1] * (self.num_layers - self.first_dense_layers)

    def moe_layer_freq(self) -> str | None:
        """Megatron's `--moe-layer-freq` pattern (runs of one kind as `[k]*n`), or None when every
        layer is MoE."""
        kinds = self.layer_kinds()
        if all(kinds):
            return None
        runs: list[list[int]] = []
        for k in kinds:
            if runs and runs[-1][0] == k:
                runs[-1][1] += 1
            else:
                runs.append([k, 1])
        return "(" + "+".join(f"[{k}]*{n}" for k, n in runs) + ")"

    def to_args(self) -> list[str]:
        """Architecture flags of Megatron-LM's `pretrain_gpt.py`."""
        a = [
            "--num-layers", str(self.num_layers),
            "--hidden-size", str(self.hidden_size),
            "--num-attention-heads", str(self.num_attention_heads),
            "--ffn-hidden-size", str(self.ffn_hidden_size),
            "--seq-length", str(self.seq_length),
            "--max-position-embeddings", str(self.seq_length),
            "--vocab-size", str(self.vocab_size),
            "--num-experts", str(self.num_experts),
            "--moe-router-topk", str(self.moe_router_topk),
            "--moe-ffn-hidden-size", str(self.moe_ffn_hidden_size),
            "--normalization", "RMSNorm",
            "--quick-geglu" if self.activation == "quick_geglu" else "--swiglu",
            *(() if self.add_bias_linear else ("--disable-bias-linear",)),
            "--position-embedding-type", "rope",
            "--rotary-base", str(self.rotary_base),
            "--moe-router-score-function", self.moe_router_score_function,
        ]
        if self.num_query_groups != self.num_attention_heads:
            a += ["--group-query-attention", "--num-query-groups", str(self.num_query_groups)]
        if self.kv_channels:
            a += ["--kv-channels", str(self.kv_channels)]
        if self.moe_shared_expert_intermediate_size:
            a += ["--moe-shared-expert-intermediate-size",
                  str(self.moe_shared_expert_intermediate_size)]
        freq = self.moe_layer_freq()
        if freq:
            a += ["--moe-layer-freq", freq]
        if self.qk_layernorm:
            a += ["--qk-layernorm"]
        if self.multi_latent_attention:
            a += ["--multi-latent-attention",
                  "--kv-lora-rank", str(self.kv_lora_rank),
                  "--qk-head-dim", str(self.qk_head_dim),
                  "--qk-pos-emb-head-dim", str(self.qk_pos_emb_head_dim),
                  "--v-head-dim", str(self.v_head_dim)]
            if self.q_lora_rank:
                a += ["--q-lora-rank", str(self.q_lora_rank)]
        if self.mtp_num_layers:
            a += ["--mtp-num-layers", str(self.mtp_num_layers)]
        if self.untie_embeddings:
            a += ["--untie-embeddings-and-output-weights"]
        if self.moe_router_num_groups:
            a += ["--moe-router-num-groups", str(self.moe_router_num_groups),
                  "--moe-router-group-topk", str(self.moe_router_group_topk)]
        if self.moe_router_topk_scaling_factor:
            a += ["--moe-router-topk-scaling-factor", str(self.moe_router_topk_scaling_factor)]
        if self.moe_router_enable_expert_bias:
            a += ["--moe-router-enable-expert-bias"]
        if self.moe_router_pre_softmax:
            a += ["--moe-router-pre-softmax"]
        if self.moe_shared_expert_gate:
            a += ["--moe-shared-expert-gate"]
        if self.add_qkv_bias:
            a += ["--add-qkv-bias"]
        if self.rotary_percent != 1.0:
            a += ["--rotary-percent", str(self.rotary_percent)]
        if self.window_size:  # causal: the window reaches back only
            a += ["--window-size", f"{self.window_size},0"]
        if self.window_size and self.window_attn_skip_freq:
            a += ["--window-attn-skip-freq", str(self.window_attn_skip_freq)]
        if self.softmax_type != "vanilla":
            a += ["--softmax-type", self.softmax_type]
        if self.glu_linear_offset:
            a += ["--glu-linear-offset", str(self.glu_linear_offset)]
        if self.activation_func_clamp_value:
            a += ["--activation-func-clamp-value", str(self.activation_func_clamp_value)]
        if self.attention_dropout is not None:
            a += ["--attention-dropout", str(self.attention_dropout)]
        return a

    def window_layers(self) -> int:
        """Layers with sliding-window attention (Megatron's is_layer_window_attention: with a skip
        frequency N, every Nth layer attends in full)."""
        if not self.window_size:
            return 0
        n = self.window_attn_skip_freq
        return self.num_layers - (self.num_layers // n if n else 0)


def parse_layer_pattern(text: str, layers: int) -> list[int] | None:
    """A `--moe-layer-freq` value as 1 (MoE) / 0 (dense) per layer: an integer N (one MoE layer in
    N, Megatron's `layer % N == 0`), or a sum of `[..]*n` runs and lists; None where absent."""
    text = text.strip()
    if not text:
        return None
    if text.isdigit():
        return [int(i % int(text) == 0) for i in range(layers)]
    out: list[int] = []
    for term in text.strip("()").split("+"):
        body, _, times = term.strip().partition("*")
        out += [int(x) for x in body.strip("[] ").split(",") if x.strip()] * int(times or 1)
    return out
