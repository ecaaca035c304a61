"""experiment/hf_import.py: a Hugging Face config.json becomes the model section of the same
architecture (the shipped experiments' where one exists, the public card's otherwise); what moetune
does not model refuses the whole config in one line naming every unsupported key."""
import dataclasses
import json
from pathlib import Path

import pytest

from moetune.experiment.hf_import import (
    IGNORED,
    NEUTRAL,
    ROWS,
    ImportRefused,
    model_from_hf,
    read_config,
)
from moetune.experiment.model import ModelArch
from moetune.experiment.schema import ConfigError, load_experiment

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "hf_configs"
FLAGS = Path(__file__).resolve().parents[2] / "moetune" / "experiment" / "megatron_flags.txt"


def _import(name: str, **kw) -> ModelArch:
    return model_from_hf(read_config(CONFIGS / f"{name}.json"), name, **kw)


@pytest.mark.parametrize("name", ["qwen3_30b_a3b", "deepseek_v3", "mixtral_8x7b"])
def test_import_gives_the_shipped_model(name):
    """The public config of a model moetune ships an experiment of imports into the very model
    section of that experiment, field for field."""
    assert _import(name) == load_experiment(name).model


def test_kimi_k2_matches_its_card():
    """Kimi-K2 (DeepSeek-V3's architecture): 61 layers, hidden 7168, 64 MLA heads, 384 experts
    top-8 with one shared, first layer dense, sigmoid router with expert bias, no MTP."""
    m = _import("kimi_k2")
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups) == (61, 7168, 64, 64)
    assert (m.num_experts, m.moe_router_topk, m.moe_ffn_hidden_size, m.moe_shared_expert_intermediate_size) == \
        (384, 8, 2048, 2048)
    assert (m.first_dense_layers, m.ffn_hidden_size, m.vocab_size, m.rotary_base) == (1, 18432, 163840, 50000)
    assert m.multi_latent_attention and (m.q_lora_rank, m.kv_lora_rank, m.qk_head_dim, m.qk_pos_emb_head_dim,
                                         m.v_head_dim) == (1536, 512, 128, 64, 128)
    assert m.moe_router_score_function == "sigmoid" and m.moe_router_enable_expert_bias
    assert m.moe_router_topk_scaling_factor == pytest.approx(2.827)
    assert m.moe_router_num_groups is None and m.mtp_num_layers == 0  # one group is no grouping


def test_gpt_oss_120b_matches_its_card():
    """GPT-OSS-120B: 36 layers, hidden 2880, 64 query heads of dim 64 over 8 KV heads, 128 experts
    top-4 of width 2880, sliding window 128 on every other layer (the first slides), attention
    sinks, biased linear layers, GLU clamped at 7 with linear offset 1; 116.8 B parameters."""
    from moetune.estimate.memory import count_params
    m = _import("gpt_oss_120b")
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups, m.kv_channels) == \
        (36, 2880, 64, 8, 64)
    assert (m.num_experts, m.moe_router_topk, m.moe_ffn_hidden_size, m.vocab_size) == (128, 4, 2880, 201088)
    assert (m.window_size, m.window_attn_skip_freq, m.window_layers()) == (128, 2, 18)
    assert m.softmax_type == "learnable" and m.add_bias_linear and m.activation == "quick_geglu"
    assert (m.glu_linear_offset, m.activation_func_clamp_value, m.rotary_base) == (1.0, 7.0, 150000)
    assert count_params(m).total / 1e9 == pytest.approx(116.8, abs=0.05)
    argv = m.to_args()
    assert argv[argv.index("--window-size") + 1] == "128,0" and "--disable-bias-linear" not in argv
    assert argv[argv.index("--softmax-type") + 1] == "learnable" and "--quick-geglu" in argv


def test_layer_types_outside_a_skip_pattern_are_refused():
    """Sliding layers Megatron's --window-attn-skip-freq cannot place (here the first full, the
    second sliding) are named, not rounded to another pattern."""
    cfg = json.loads((CONFIGS / "gpt_oss_120b.json").read_text())
    cfg["layer_types"] = ["full_attention", "sliding_attention"] * 18
    with pytest.raises(ImportRefused, match="layer_types=.18 sliding_attention of 36 layers."):
        model_from_hf(cfg, "g")


def test_qwen2_moe_and_glm_carry_what_their_code_fixes():
    """Qwen1.5-MoE: QKV bias, a gated shared expert and un-renormalised softmax routing (Megatron's
    pre-softmax); GLM-4.5-Air: QKV bias, half-rotary heads, sigmoid router with expert bias."""
    q = _import("qwen1_5_moe_a2_7b")
    assert q.add_qkv_bias and q.moe_shared_expert_gate and q.moe_router_pre_softmax
    assert (q.num_experts, q.moe_router_topk, q.moe_shared_expert_intermediate_size) == (60, 4, 5632)
    g = _import("glm_4_5_air")
    assert g.add_qkv_bias and g.rotary_percent == 0.5 and not g.moe_router_pre_softmax
    assert (g.moe_router_score_function, g.moe_router_enable_expert_bias, g.first_dense_layers) == ("sigmoid", True, 1)
    assert (g.kv_channels, g.num_query_groups, g.mtp_num_layers) == (128, 8, 1)


@pytest.mark.parametrize("name", ["qwen3_30b_a3b", "deepseek_v3", "kimi_k2", "mixtral_8x7b", "qwen1_5_moe_a2_7b",
                                  "glm_4_5_air", "gpt_oss_120b"])
def test_imported_model_round_trips_its_megatron_flags(name):
    """Every field of an imported model survives its Megatron argv and back."""
    m = _import(name)
    assert ModelArch.from_args(m.to_args(), name=m.name) == m


def test_mapping_table_names_real_megatron_flags_and_fields():
    """Each row's flag is one Megatron's parser takes and its field is a ModelArch field."""
    flags = {line.strip() for line in FLAGS.read_text().splitlines() if line.startswith("--")}
    fields = {f.name for f in dataclasses.fields(ModelArch)}
    for row in ROWS:
        assert row.flag in flags, row
        assert row.field in fields, row


def test_qwen3_next_refused_in_one_line_naming_every_unsupported_key():
    """Qwen3-Next's hybrid layers: one line naming the model type, its linear-attention layers and
    every linear_* key, the partial rotary; no key moetune does model is named."""
    with pytest.raises(ImportRefused) as e:
        _import("qwen3_next_80b_a3b")
    msg = str(e.value)
    assert "\n" not in msg and "qwen3_next" in msg
    assert "layer_types=[36 linear_attention of 48 layers]" in msg
    for key in ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_num_key_heads", "linear_num_value_heads",
                "linear_value_head_dim", "full_attention_interval", "partial_rotary_factor=0.25"):
        assert key in msg
    assert "hidden_size" not in msg and "torch_dtype" not in msg


def test_a_changed_key_of_a_known_family_is_refused_with_the_others():
    """A known family with an architecture-changing value or a key moetune does not know: every one
    named at once; an ignored key (token ids, dtype) is not."""
    cfg = json.loads((CONFIGS / "qwen3_30b_a3b.json").read_text())
    cfg.update(use_sliding_window=True, sliding_window=4096, hidden_act="gelu", mystery_gate=True,
               torch_dtype="float32", bos_token_id=7)
    with pytest.raises(ImportRefused) as e:
        model_from_hf(cfg, "m")
    msg = str(e.value)
    assert "sliding_window=4096" in msg and 'hidden_act="gelu"' in msg and "mystery_gate" in msg
    assert "torch_dtype" not in msg and "bos_token_id" not in msg and "model_type" not in msg
    # a layer-pattern key of another family's code is not silently dropped
    cfg = json.loads((CONFIGS / "mixtral_8x7b.json").read_text())
    cfg["mlp_only_layers"] = [3]
    with pytest.raises(ImportRefused, match=r"mlp_only_layers=\[3\] \(dense layers\)"):
        model_from_hf(cfg, "m")


def test_dense_layers_anywhere_become_the_layer_pattern():
    """Qwen's mlp_only_layers in the middle: the whole MoE/dense pattern, rendered as Megatron's
    --moe-layer-freq runs and read back; its dense layers counted as dense (their FFN, not experts).
    Leading dense layers stay first_dense_layers."""
    from moetune.estimate.memory import count_params
    cfg = json.loads((CONFIGS / "qwen3_30b_a3b.json").read_text())
    cfg["mlp_only_layers"] = [5, 9]
    m = model_from_hf(cfg, "q")
    assert m.first_dense_layers == 0 and m.moe_layers == 46
    assert [i for i, k in enumerate(m.layer_kinds()) if not k] == [5, 9]
    assert m.moe_layer_freq() == "([1]*5+[0]*1+[1]*3+[0]*1+[1]*38)"
    assert ModelArch.from_args(m.to_args(), name="q") == m
    every_moe = _import("qwen3_30b_a3b")
    h = 2048
    assert count_params(m).dense - count_params(every_moe).dense == 2 * 3 * h * 6144
    assert count_params(every_moe).experts - count_params(m).experts == 2 * 3 * h * 768 * 128
    cfg["mlp_only_layers"] = [0, 1]  # leading dense layers are the model moetune prices
    m = model_from_hf(cfg, "q")
    assert (m.first_dense_layers, m.moe_layer_pattern) == (2, None)


def test_ignored_and_neutral_keys_do_not_overlap_the_table():
    """A key is mapped, accepted at a neutral value, or ignored; ignoring never hides a mapped key."""
    mapped = {r.hf for r in ROWS}
    assert not IGNORED & mapped and not IGNORED & {n.hf for n in NEUTRAL}


def test_unreadable_configs_are_one_line(tmp_path):
    """A missing file, bad JSON, a list, a missing size: ConfigError naming the file."""
    with pytest.raises(ConfigError, match="no such file"):
        read_config(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        read_config(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(ConfigError, match="a JSON object"):
        read_config(tmp_path / "list.json")
    cfg = json.loads((CONFIGS / "mixtral_8x7b.json").read_text())
    del cfg["vocab_size"]
    with pytest.raises(ConfigError, match="missing vocab_size"):
        model_from_hf(cfg, "m")


@pytest.mark.megatron
def test_imported_models_pass_megatron_validation():
    """Every importable fixture's argv, at a layout its experts and heads divide, goes through
    Megatron's own parse_args, validate_args and TransformerConfig (GPT-OSS's window, sinks,
    biases and clamped GLU flags included)."""
    from moetune.experiment import megatron_validate as mv
    from moetune.experiment.config import TrainingConfig, run_args
    if not mv.available():
        pytest.skip("no .venv-megatron (scripts/megatron-venv)")
    names = ["qwen3_30b_a3b", "deepseek_v3", "kimi_k2", "mixtral_8x7b", "qwen1_5_moe_a2_7b", "glm_4_5_air",
             "gpt_oss_120b"]
    cfg = json.loads((CONFIGS / "qwen3_30b_a3b.json").read_text())
    cfg["mlp_only_layers"] = [5, 9]  # dense layers between MoE ones: --moe-layer-freq as runs
    argvs = []
    for m in [_import(name) for name in names] + [model_from_hf(cfg, "q")]:
        c = TrainingConfig(tp=2, ep=4, etp=1, sequence_parallel=True, global_batch=64, grouped_gemm=True,
                           distributed_optimizer=True)
        argvs.append(c.to_args(m) + run_args())
    assert mv.validate(argvs, 64) == [None] * (len(names) + 1)
