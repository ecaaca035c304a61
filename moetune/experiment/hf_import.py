"""A Hugging Face `config.json` of a MoE model as moetune's model section (`ModelArch`).

`ROWS` is the one mapping table: each row is one HF key, the ModelArch field it sets and the
Megatron flag that field becomes (model.py `to_args`). A key the table does not map is either in
`NEUTRAL` (accepted only at the value moetune's model already has), in `IGNORED` (it does not
change the architecture: token ids, dtype, caching, training-loss coefficients), or unsupported.
Unsupported keys refuse the whole config in one line naming all of them: moetune never prices a
model other than the one the file describes.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from moetune.experiment.model import ModelArch
from moetune.experiment.schema import ConfigError, one_line

# families Megatron-Core trains as MoE transformers, by HF model_type and by architecture class
QWEN, DEEPSEEK, MIXTRAL, GLM, GPTOSS = "qwen-moe", "deepseek", "mixtral", "glm4-moe", "gpt-oss"
MODEL_TYPES = {"qwen2_moe": QWEN, "qwen3_moe": QWEN, "deepseek_v2": DEEPSEEK, "deepseek_v3": DEEPSEEK,
               "kimi_k2": DEEPSEEK, "mixtral": MIXTRAL, "glm4_moe": GLM, "gpt_oss": GPTOSS}
ARCHITECTURES = {"Qwen2MoeForCausalLM": QWEN, "Qwen3MoeForCausalLM": QWEN, "DeepseekV2ForCausalLM": DEEPSEEK,
                 "DeepseekV3ForCausalLM": DEEPSEEK, "MixtralForCausalLM": MIXTRAL, "Glm4MoeForCausalLM": GLM,
                 "GptOssForCausalLM": GPTOSS}
ALL = (QWEN, DEEPSEEK, MIXTRAL, GLM, GPTOSS)
WINDOWED = (MIXTRAL, GPTOSS)  # families whose sliding window moetune models


class ImportRefused(ConfigError):
    """A config.json moetune cannot model whole (one line naming every unsupported field)."""


Convert = Callable[[Any, dict], Any]


def _same(value: Any, _cfg: dict) -> Any:
    return value


def _int(value: Any, _cfg: dict) -> int:
    return int(value)


@dataclass(frozen=True)
class Row:
    """One HF key of the mapping table."""
    hf: str
    """The key in config.json."""
    field: str
    """The ModelArch field it sets."""
    flag: str
    """The Megatron flag that field becomes."""
    families: tuple[str, ...] = ALL
    """The families whose configs carry the key with this meaning."""
    convert: Convert = _same
    """The field's value from the key's value and the whole config."""


def _shared_ffn(n_shared: Any, cfg: dict) -> int | None:
    # DeepSeek and GLM count shared experts; Megatron takes their summed width
    return int(n_shared) * int(cfg["moe_intermediate_size"]) if n_shared else None


def _groups(n_group: Any, cfg: dict) -> int | None:
    # groups route only with a grouped top-k method; one group is no grouping
    limited = cfg.get("topk_method", "noaux_tc") in ("group_limited_greedy", "noaux_tc")
    return int(n_group) if limited and n_group and int(n_group) > 1 else None


def _group_topk(topk_group: Any, cfg: dict) -> int | None:
    return int(topk_group) if _groups(cfg.get("n_group"), cfg) else None


def _scaling(factor: Any, _cfg: dict) -> float | None:
    return float(factor) if factor and float(factor) != 1.0 else None


def _score(cfg: dict) -> str:
    """The router's score function: the config's, else the one its family's code fixes."""
    implied = IMPLIED.get(str(cfg.get("model_type")), {}).get("moe_router_score_function", "softmax")
    return str(cfg.get("scoring_func") or implied)


def _skip_freq(types: Any) -> int | None | bool:
    """Megatron's --window-attn-skip-freq N for a per-layer list of attention kinds: every Nth
    layer full, the rest sliding; None where every layer slides; False where no N gives the list."""
    if not isinstance(types, list) or not set(types) <= {"sliding_attention", "full_attention"}:
        return False
    sliding = [t == "sliding_attention" for t in types]
    if all(sliding):
        return None
    for n in range(2, len(types) + 1):
        if sliding == [(i + 1) % n != 0 for i in range(len(types))]:
            return n
    return False


def _window(size: Any, cfg: dict) -> int | None:
    # a window no layer uses (every layer listed full) is no window
    types = cfg.get("layer_types")
    if not size or (isinstance(types, list) and "sliding_attention" not in types):
        return None
    return int(size)


def _head_dim(head_dim: Any, cfg: dict) -> int | None:
    # Megatron's default head dim is hidden / heads; a different one is --kv-channels
    if head_dim is None or int(head_dim) * int(cfg["num_attention_heads"]) == int(cfg["hidden_size"]):
        return None
    return int(head_dim)


ROWS: tuple[Row, ...] = (
    Row("num_hidden_layers", "num_layers", "--num-layers", convert=_int),
    Row("hidden_size", "hidden_size", "--hidden-size", convert=_int),
    Row("num_attention_heads", "num_attention_heads", "--num-attention-heads", convert=_int),
    Row("num_key_value_heads", "num_query_groups", "--num-query-groups", convert=_int),
    Row("head_dim", "kv_channels", "--kv-channels", (QWEN, MIXTRAL, GLM, GPTOSS), _head_dim),
    Row("intermediate_size", "ffn_hidden_size", "--ffn-hidden-size", convert=_int),
    Row("moe_intermediate_size", "moe_ffn_hidden_size", "--moe-ffn-hidden-size", (QWEN, DEEPSEEK, GLM), _int),
    Row("intermediate_size", "moe_ffn_hidden_size", "--moe-ffn-hidden-size", (MIXTRAL, GPTOSS), _int),
    Row("num_experts", "num_experts", "--num-experts", (QWEN,), _int),
    Row("n_routed_experts", "num_experts", "--num-experts", (DEEPSEEK, GLM), _int),
    Row("num_local_experts", "num_experts", "--num-experts", (MIXTRAL, GPTOSS), _int),
    Row("num_experts_per_tok", "moe_router_topk", "--moe-router-topk", convert=_int),
    Row("vocab_size", "vocab_size", "--vocab-size", convert=_int),
    Row("rope_theta", "rotary_base", "--rotary-base", convert=_int),
    Row("tie_word_embeddings", "untie_embeddings", "--untie-embeddings-and-output-weights",
        convert=lambda v, _c: not v),
    Row("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size",
        "--moe-shared-expert-intermediate-size", (QWEN,), lambda v, _c: int(v) or None),
    Row("n_shared_experts", "moe_shared_expert_intermediate_size", "--moe-shared-expert-intermediate-size",
        (DEEPSEEK, GLM), _shared_ffn),
    Row("first_k_dense_replace", "first_dense_layers", "--moe-layer-freq", (DEEPSEEK, GLM), _int),
    Row("use_qk_norm", "qk_layernorm", "--qk-layernorm", (GLM,), lambda v, _c: bool(v)),
    Row("attention_bias", "add_qkv_bias", "--add-qkv-bias", (GLM,), lambda v, _c: bool(v)),
    Row("partial_rotary_factor", "rotary_percent", "--rotary-percent", (GLM,), lambda v, _c: float(v)),
    Row("q_lora_rank", "q_lora_rank", "--q-lora-rank", (DEEPSEEK,), lambda v, _c: int(v) if v else None),
    Row("kv_lora_rank", "kv_lora_rank", "--kv-lora-rank", (DEEPSEEK,), _int),
    Row("qk_nope_head_dim", "qk_head_dim", "--qk-head-dim", (DEEPSEEK,), _int),
    Row("qk_rope_head_dim", "qk_pos_emb_head_dim", "--qk-pos-emb-head-dim", (DEEPSEEK,), _int),
    Row("v_head_dim", "v_head_dim", "--v-head-dim", (DEEPSEEK,), _int),
    Row("scoring_func", "moe_router_score_function", "--moe-router-score-function", (DEEPSEEK,)),
    Row("n_group", "moe_router_num_groups", "--moe-router-num-groups", (DEEPSEEK, GLM), _groups),
    Row("topk_group", "moe_router_group_topk", "--moe-router-group-topk", (DEEPSEEK, GLM), _group_topk),
    Row("routed_scaling_factor", "moe_router_topk_scaling_factor", "--moe-router-topk-scaling-factor",
        (DEEPSEEK, GLM), _scaling),
    Row("topk_method", "moe_router_enable_expert_bias", "--moe-router-enable-expert-bias", (DEEPSEEK,),
        lambda v, _c: v == "noaux_tc"),
    Row("num_nextn_predict_layers", "mtp_num_layers", "--mtp-num-layers", (DEEPSEEK, GLM), _int),
    Row("norm_topk_prob", "moe_router_pre_softmax", "--moe-router-pre-softmax", (QWEN, DEEPSEEK, GLM),
        lambda v, c: not v and _score(c) == "softmax"),
    Row("sliding_window", "window_size", "--window-size", WINDOWED, _window),
    Row("layer_types", "window_attn_skip_freq", "--window-attn-skip-freq", WINDOWED,
        lambda v, _c: _skip_freq(v) or None),
    Row("attention_bias", "add_bias_linear", "--disable-bias-linear", (GPTOSS,), lambda v, _c: bool(v)),
    # GPT-OSS only: with its window and sinks the dropout decides TE's attention backend and memory
    Row("attention_dropout", "attention_dropout", "--attention-dropout", (GPTOSS,), lambda v, _c: float(v)),
    Row("swiglu_limit", "activation_func_clamp_value", "--activation-func-clamp-value", (GPTOSS,),
        lambda v, _c: float(v) if v else None),
)

# what each family's architecture is beyond its keys (HF's modelling code fixes it, no key says it)
IMPLIED: dict[str, dict[str, Any]] = {
    "qwen2_moe": {"add_qkv_bias": True, "moe_shared_expert_gate": True},
    "qwen3_moe": {"qk_layernorm": True},
    "deepseek_v2": {"multi_latent_attention": True},
    "deepseek_v3": {"multi_latent_attention": True, "moe_router_score_function": "sigmoid"},
    "kimi_k2": {"multi_latent_attention": True, "moe_router_score_function": "sigmoid"},
    # GLM-4.5's router: sigmoid scores with the aux-loss-free correction bias
    "glm4_moe": {"moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True},
    # GPT-OSS: a learnable sink per head, biased linear layers, the GLU gate*sigmoid(1.702 gate)
    # times (up + 1) (Megatron's quick-GeGLU with linear offset 1)
    "gpt_oss": {"softmax_type": "learnable", "add_bias_linear": True, "activation": "quick_geglu",
                "glu_linear_offset": 1.0},
}


def _off(value: Any) -> bool:
    return value in (None, False, 0, [], "", {})


@dataclass(frozen=True)
class Neutral:
    """A key accepted only where its value is what moetune's model already is."""
    hf: str
    """The key in config.json."""
    accepted: Callable[[Any, dict], bool]
    """Whether the value (given the whole config) leaves the architecture moetune models."""
    what: str
    """What a refused value would need moetune to model."""


NEUTRAL: tuple[Neutral, ...] = (
    Neutral("hidden_act", lambda v, _c: v == "silu", "an activation other than SwiGLU's silu"),
    Neutral("attention_bias", lambda v, c: _off(v) or _family(c) == GLM or (_family(c) == GPTOSS and v is True),
            "biases in the attention projections"),
    Neutral("mlp_bias", lambda v, _c: _off(v), "biases in the MLP"),
    Neutral("sliding_window", lambda v, c: _off(v) or _off(c.get("use_sliding_window", True))
            or _family(c) in WINDOWED, "sliding-window attention"),
    Neutral("use_sliding_window", lambda v, c: _off(v) or _off(c.get("sliding_window")), "sliding-window attention"),
    Neutral("max_window_layers", lambda v, c: _off(c.get("use_sliding_window")), "sliding-window attention"),
    # the layer pattern's keys, placed by _moe_layers in the families whose code reads them
    Neutral("mlp_only_layers", lambda v, c: _off(v) or _family(c) == QWEN, "dense layers"),
    Neutral("decoder_sparse_step", lambda v, c: v in (None, 1) or _family(c) == QWEN, "dense layers"),
    Neutral("moe_layer_freq", lambda v, c: v in (None, 1) or _family(c) in (DEEPSEEK, GLM), "dense layers"),
    Neutral("partial_rotary_factor", lambda v, c: v in (None, 1, 1.0) or _family(c) == GLM, "partial rotary"),
    Neutral("pretraining_tp", lambda v, _c: v in (None, 1), "a split of the output projection"),
    Neutral("layer_types", lambda v, c: all(t == "full_attention" for t in v or [])
            or (_family(c) in WINDOWED and _skip_freq(v) is not False),
            "layer kinds other than full attention, or sliding layers in no --window-attn-skip-freq pattern"),
    Neutral("experts_per_token", lambda v, c: v == c.get("num_experts_per_tok"), "a second top-k"),
    Neutral("use_qk_norm", lambda v, c: _off(v) or _family(c) == GLM, "QK norm"),
    # without attention sinks the dropout changes nothing moetune prices (fused attention keeps an
    # RNG state, not a mask); GPT-OSS's, with sinks, is mapped (ROWS)
    Neutral("attention_dropout", lambda _v, _c: True, "attention dropout"),
)

# keys that do not change the architecture moetune prices or Megatron builds at seq_length:
# token ids, dtype, serving and caching, training-loss coefficients, initialisation, norm epsilon,
# context-extension RoPE scaling (a positional scale, not a size) and HF's own bookkeeping
IGNORED = frozenset({
    "architectures", "model_type", "auto_map", "transformers_version", "_name_or_path", "name_or_path",
    "torch_dtype", "dtype", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "tokenizer_class",
    "quantization_config", "max_position_embeddings", "initializer_range", "rms_norm_eps",
    "hidden_dropout", "output_router_logits", "router_aux_loss_coef", "aux_loss_alpha", "seq_aux",
    "router_jitter_noise", "rope_scaling", "rope_interleave", "ep_size", "output_attentions",
    "output_hidden_states", "return_dict", "id2label", "label2id", "is_encoder_decoder", "tie_encoder_decoder",
    "num_attention_heads_kv", "initial_context_length",
})


def _family(cfg: dict) -> str | None:
    family = MODEL_TYPES.get(str(cfg.get("model_type")))
    for arch in cfg.get("architectures") or []:
        family = family or ARCHITECTURES.get(str(arch))
    return family


def _moe_layers(cfg: dict, family: str, layers: int) -> list[int]:
    """1 for each MoE layer, 0 for a dense one, as HF's modelling code of the family places them."""
    if family == QWEN:
        step, dense = int(cfg.get("decoder_sparse_step") or 1), set(cfg.get("mlp_only_layers") or [])
        return [int(i not in dense and (i + 1) % step == 0) for i in range(layers)]
    if family in (DEEPSEEK, GLM):
        first, freq = int(cfg.get("first_k_dense_replace") or 0), int(cfg.get("moe_layer_freq") or 1)
        return [int(i >= first and i % freq == 0) for i in range(layers)]
    return [1] * layers


def unsupported(cfg: dict) -> list[str]:
    """Every key of `cfg` moetune cannot model, each as `key (why)`; empty where it models it whole."""
    family = _family(cfg)
    out = []
    if family is None:
        arch = ", ".join(map(str, cfg.get("architectures") or [])) or "no architectures"
        out.append(f"model_type {cfg.get('model_type')!r} ({arch}: not a family moetune models; known: "
                   f"{', '.join(sorted(MODEL_TYPES))})")
    # an unknown family's sizes are not refused one by one: its model_type already is
    mapped = {r.hf for r in ROWS if family in r.families or family is None}
    neutral = {n.hf: n for n in NEUTRAL}
    for key in sorted(cfg):
        value = cfg[key]
        if key in IGNORED or (key in mapped and key not in neutral):
            continue
        if key in neutral:
            if not neutral[key].accepted(value, cfg):
                out.append(f"{key}={_short(value)} ({neutral[key].what})")
            continue
        if key.startswith("linear_") or key in ("full_attention_interval", "mamba_d_state", "ssm_cfg"):
            out.append(f"{key} (linear-attention / state-space layers)")
        else:
            out.append(f"{key} (not a key moetune models)")
    layers = cfg.get("num_hidden_layers")
    if family and isinstance(layers, int) and layers > 0:
        pattern = _moe_layers(cfg, family, layers)
        first = pattern.index(1) if 1 in pattern else layers
        if first == layers:
            out.append("no MoE layer (a dense model; moetune tunes MoE training)")
    return out


def _short(value: Any) -> str:
    """A value as the refusal names it: a layer list by the kinds it holds, else its JSON (short)."""
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        kinds = sorted(set(value) - {"full_attention"})
        return "[" + ", ".join(f"{value.count(k)} {k}" for k in kinds) + f" of {len(value)} layers]"
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "num_experts_per_tok")


def model_from_hf(cfg: dict, name: str, seq_length: int = 4096, where: str = "the Hugging Face config") -> ModelArch:
    """The ModelArch `cfg` (a parsed config.json) describes, named `name`, trained at `seq_length`.
    ImportRefused (one line naming every unsupported key) where moetune cannot model it whole;
    ConfigError where a key it needs is missing or malformed."""
    refused = unsupported(cfg)
    if refused:
        raise ImportRefused(f"{where}: moetune cannot model this config whole, nothing written; unsupported: "
                            + "; ".join(refused))
    family = _family(cfg)
    assert family is not None  # unsupported() refused it otherwise
    missing = [k for k in REQUIRED if k not in cfg]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)} (a {cfg.get('model_type')} config has them)")
    values: dict[str, Any] = {"name": name, "seq_length": seq_length, "untie_embeddings": True}
    values.update(IMPLIED.get(str(cfg.get("model_type")), {}))
    try:
        for row in ROWS:
            if family in row.families and row.hf in cfg:
                values[row.field] = row.convert(cfg[row.hf], cfg)
    except (TypeError, ValueError, KeyError) as e:
        raise ConfigError(f"{where}: {row.hf}: {_short(cfg.get(row.hf))} is not usable ({e})") from None
    values.setdefault("num_query_groups", values["num_attention_heads"])
    # leading dense layers however the family places them (Qwen's mlp_only_layers too)
    pattern = _moe_layers(cfg, family, int(cfg["num_hidden_layers"]))
    first = pattern.index(1)
    if pattern == [0] * first + [1] * (len(pattern) - first):
        values["first_dense_layers"] = first
    else:  # dense layers between MoE ones: the whole pattern (--moe-layer-freq as a list)
        values.update(first_dense_layers=0, moe_layer_pattern=tuple(pattern))
    if _score(cfg) == "sigmoid" and cfg.get("norm_topk_prob") is False:
        raise ImportRefused(f"{where}: moetune cannot model this config whole, nothing written; unsupported: "
                            "norm_topk_prob=false (sigmoid scores that Megatron's router always renormalises)")
    values.setdefault("moe_ffn_hidden_size", values.get("ffn_hidden_size"))
    values.setdefault("ffn_hidden_size", values.get("moe_ffn_hidden_size"))
    if values.get("num_experts") is None or values.get("ffn_hidden_size") is None:
        raise ConfigError(f"{where}: no expert count or FFN size; a {family} config names both")
    try:
        return TypeAdapter(ModelArch).validate_python(values)
    except ValidationError as e:
        raise ConfigError(f"{where}: {one_line(e, 'model')}") from None


def read_config(path: str | Path) -> dict:
    """A config.json's mapping; ConfigError (one line) where it cannot be read or is not one."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such file; give a Hugging Face config.json") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p}: line {e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a JSON object (a Hugging Face config.json)")
    return data


def not_carried(cfg: dict) -> list[str]:
    """The IGNORED keys `cfg` sets (HF's own bookkeeping left out): what the experiment does not
    carry, for its YAML to say so."""
    return sorted(k for k in cfg if k in IGNORED and k not in ("architectures", "model_type", "transformers_version"))


def table() -> list[tuple[str, str, str]]:
    """The mapping table as (HF key, ModelArch field, Megatron flag) rows, for the docs and tests."""
    return [(r.hf, r.field, r.flag) for r in ROWS]
