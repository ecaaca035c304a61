"""An experiment's `extra_args`: Megatron flags moetune does not model, passed through to every
trial's command line as written and left out of the memory estimate and the step-time model.

A flag moetune renders itself (the model's, the training config's, the fixed run flags) is refused,
naming the key that sets it: two values of one flag would leave Megatron the last and moetune's
prices wrong. That check needs nothing but moetune's own tables, so the schema runs it on load;
Megatron's parser (megatron_validate.check_extra_args) runs where a command is about to use them.
"""
from __future__ import annotations

from moetune.experiment.config import APEX_LESS_FLAGS, FLAG_VERSIONS, FLAGS, TE_LESS_FLAGS, run_args
from moetune.experiment.fit import FAKE_GROUP_ARGS
from moetune.experiment.model import ModelArch


def _model_samples() -> list[str]:
    """The argv ModelArch.to_args renders for a model with every option on, then for one with none."""
    full = ModelArch(name="all", num_layers=4, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                     ffn_hidden_size=64, moe_ffn_hidden_size=32, num_experts=4, moe_router_topk=2, vocab_size=128,
                     seq_length=64, kv_channels=32, moe_shared_expert_intermediate_size=32, first_dense_layers=1,
                     qk_layernorm=True, multi_latent_attention=True, q_lora_rank=16, kv_lora_rank=16, qk_head_dim=16,
                     qk_pos_emb_head_dim=8, v_head_dim=16, mtp_num_layers=1, moe_router_num_groups=2,
                     moe_router_group_topk=1, moe_router_topk_scaling_factor=2.0,
                     moe_router_enable_expert_bias=True, moe_router_pre_softmax=True, moe_shared_expert_gate=True,
                     add_qkv_bias=True, rotary_percent=0.5, window_size=8, window_attn_skip_freq=2,
                     softmax_type="learnable", add_bias_linear=True, activation="quick_geglu", glu_linear_offset=1.0,
                     activation_func_clamp_value=7.0, attention_dropout=0.0)
    plain = ModelArch(name="plain", num_layers=4, hidden_size=64, num_attention_heads=4, num_query_groups=4,
                      ffn_hidden_size=64, moe_ffn_hidden_size=32, num_experts=4, moe_router_topk=2, vocab_size=128,
                      seq_length=64)
    # the plain model's too: flags an option turns off (--swiglu, --disable-bias-linear)
    return full.to_args() + plain.to_args()


def _every_model_flag() -> list[str]:
    """Every flag ModelArch.to_args can render."""
    return [token for token in _model_samples() if token.startswith("--")]


def model_switches() -> set[str]:
    """The model flags that take no value (a flag or the end follows them in to_args)."""
    argv = _model_samples()
    pairs = zip(argv, argv[1:] + ["--"], strict=True)
    return {t for t, after in pairs if t.startswith("--") and after.startswith("--")}


def controlled_flags() -> dict[str, str]:
    """{flag: the experiment key that sets it} for every flag moetune renders on a trial's argv."""
    out = {flag: "the model section" for flag in _every_model_flag()}
    out.update({spec.flag: f"baseline.{spec.field}" for spec in FLAGS})
    out.update({row.before: out.get(row.flag, "baseline") for row in FLAG_VERSIONS})
    for flag in ("--seq-length", "--max-position-embeddings"):
        out[flag] = "model.seq_length (or baseline.seq_length)"
    fixed = [t for t in run_args() + list(TE_LESS_FLAGS + APEX_LESS_FLAGS + FAKE_GROUP_ARGS) if t.startswith("--")]
    out.update({flag: "moetune's run flags" for flag in fixed + ["--bf16", "--recompute-method",
                                                                  "--fine-grained-activation-offloading"]})
    out["--ckpt-format"] = "baseline.fsdp"
    return out


def check(args: list[str], where: str) -> list[str]:
    """`args` where moetune may pass them through; ValueError (one line naming every refused token,
    `where` first) otherwise."""
    problems = []
    bad = [a for a in args if not a or any(ch in a for ch in "\n\r\0")]
    if bad:
        problems.append(f"empty or multi-line entries {bad!r}")
    controlled = controlled_flags()
    taken = [f"{flag} (set by {controlled[flag]})" for flag in
             dict.fromkeys(a.split("=", 1)[0] for a in args) if flag in controlled]
    if taken:
        problems.append("flags moetune sets itself: " + ", ".join(taken))
    if args and not args[0].startswith("-"):
        problems.append(f"{args[0]!r} is a value with no flag before it")
    if problems:
        raise ValueError(f"{where}: " + "; ".join(problems))
    return list(args)
