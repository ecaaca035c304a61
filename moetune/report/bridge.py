"""The exported trial as Megatron-Bridge recipe overrides: Hydra-style `key=value` lines on a
`ConfigContainer` (model.*, train.*, comm_overlap.*, ddp.*, optimizer.*, mixed_precision), one a
line, each shell-quoted, for a recipe launcher such as Megatron-Bridge's scripts/training/run_recipe.py.

The field names are Megatron-Bridge's (src/megatron/bridge/training/config.py, comm_overlap.py,
mixed_precision.py; scripts/translate_mlm_to_bridge.py's mapping from Megatron-LM flags). A
TrainingConfig field or model flag with no Bridge field is a comment naming its Megatron flag."""
from __future__ import annotations

import re
import shlex
from typing import Any

from moetune.experiment.config import FLAGS, TrainingConfig
from moetune.experiment.environment import config_env
from moetune.report.megatron_export import MEASURING, PLACEHOLDERS, Chosen, groups, one_line

# TrainingConfig field -> the Bridge keys that take its value
LAYOUT_KEYS: dict[str, tuple[str, ...]] = {
    "tp": ("model.tensor_model_parallel_size",),
    "pp": ("model.pipeline_model_parallel_size",),
    "vpp": ("model.virtual_pipeline_model_parallel_size",),
    "first_pp_layers": ("model.num_layers_in_first_pipeline_stage",),
    "last_pp_layers": ("model.num_layers_in_last_pipeline_stage",),
    "cp": ("model.context_parallel_size",),
    "ep": ("model.expert_model_parallel_size",),
    "etp": ("model.expert_tensor_parallel_size",),
    "sequence_parallel": ("model.sequence_parallel",),
    "micro_batch": ("train.micro_batch_size",),
    "global_batch": ("train.global_batch_size",),
    "seq_length": ("model.seq_length", "dataset.seq_length"),
    "dispatcher": ("model.moe_token_dispatcher_type",),
    "flex_backend": ("model.moe_flex_dispatcher_backend",),
    "deepep_num_sms": ("model.moe_deepep_num_sms",),
    "hybridep_num_sms": ("model.moe_hybridep_num_sms",),
    "overlap_ep_a2a": ("comm_overlap.overlap_moe_expert_parallel_comm",),
    "delay_wgrad": ("comm_overlap.delay_wgrad_compute",),
    "shared_expert_overlap": ("model.moe_shared_expert_overlap",),
    "tp_comm_overlap": ("comm_overlap.tp_comm_overlap",),
    "overlap_p2p_comm": ("comm_overlap.overlap_p2p_comm",),
    "overlap_grad_reduce": ("comm_overlap.overlap_grad_reduce",),
    "overlap_param_gather": ("comm_overlap.overlap_param_gather",),
    "distributed_optimizer": ("ddp.use_distributed_optimizer", "optimizer.use_distributed_optimizer"),
    "precision_aware_optimizer": ("optimizer.use_precision_aware_optimizer",),
    "recompute_granularity": ("model.recompute_granularity",),
    "recompute_modules": ("model.recompute_modules",),
    "recompute_num_layers": ("model.recompute_num_layers",),
    "offload_modules": ("model.offload_modules",),
    "cuda_graph_impl": ("model.cuda_graph_impl",),
    "cuda_graph_modules": ("model.cuda_graph_scope",),
    "grouped_gemm": ("model.moe_grouped_gemm",),
    "permute_fusion": ("model.moe_permute_fusion",),
    "router_fusion": ("model.moe_router_fusion",),
    "cross_entropy_fusion": ("model.cross_entropy_loss_fusion",),
    "router_dtype": ("model.moe_router_dtype",),
    "capacity_factor": ("model.moe_expert_capacity_factor",),
    "pad_to_capacity": ("model.moe_pad_expert_input_to_capacity",),
    "manual_gc": ("train.manual_gc",),
    "manual_gc_interval": ("train.manual_gc_interval",),
}
# fields whose None (or empty) means Megatron's default, not a value: left to the recipe
DEFAULTED = ("deepep_num_sms", "hybridep_num_sms", "recompute_num_layers", "manual_gc_interval",
             "cuda_graph_modules")
# fields set by `mixed_precision` (below), and those of the measurement alone
PRECISION_FIELDS = ("fp8_format", "fp8_recipe")
MEASURING_FIELDS = ("train_iters", "profile_step_start", "profile_step_end", "force_balance")
# Megatron FSDP's fields: set only where it is on (Bridge's default is off), with the checkpoint
# format it requires (Megatron-Bridge skills/nemo-mbridge-perf-megatron-fsdp, Enablement)
FSDP_FIELDS = ("fsdp", "fsdp_sharding")

# Megatron's --fp8-recipe -> Bridge's named MixedPrecisionConfig recipe (mixed_precision.py)
FP8_RECIPES = {"tensorwise": "bf16_with_fp8_current_scaling_mixed", "delayed": "bf16_with_fp8_delayed_scaling_mixed",
               "blockwise": "bf16_with_fp8_subchannel_scaling_mixed", "mxfp8": "bf16_with_mxfp8_mixed"}

# the model's Megatron flag -> (Bridge key, value where the flag is a switch); None: implied by another
ARCH_KEYS: dict[str, tuple[tuple[str, Any], ...] | None] = {
    "--num-layers": (("model.num_layers", None),),
    "--hidden-size": (("model.hidden_size", None),),
    "--num-attention-heads": (("model.num_attention_heads", None),),
    "--num-query-groups": (("model.num_query_groups", None),),
    "--group-query-attention": None,  # implied by model.num_query_groups
    "--kv-channels": (("model.kv_channels", None),),
    "--ffn-hidden-size": (("model.ffn_hidden_size", None),),
    "--seq-length": None,  # the layout's seq_length row sets it
    "--max-position-embeddings": (("model.max_position_embeddings", None),),
    "--vocab-size": (("tokenizer.vocab_size", None),),
    "--num-experts": (("model.num_moe_experts", None),),
    "--moe-router-topk": (("model.moe_router_topk", None),),
    "--moe-ffn-hidden-size": (("model.moe_ffn_hidden_size", None),),
    "--moe-shared-expert-intermediate-size": (("model.moe_shared_expert_intermediate_size", None),),
    "--moe-layer-freq": (("model.moe_layer_freq", None),),
    "--moe-router-score-function": (("model.moe_router_score_function", None),),
    "--moe-router-num-groups": (("model.moe_router_num_groups", None),),
    "--moe-router-group-topk": (("model.moe_router_group_topk", None),),
    "--moe-router-topk-scaling-factor": (("model.moe_router_topk_scaling_factor", None),),
    "--moe-router-enable-expert-bias": (("model.moe_router_enable_expert_bias", True),),
    "--normalization": (("model.normalization", None),),
    "--swiglu": (("model.gated_linear_unit", True), ("model.activation_func", "silu")),
    "--disable-bias-linear": (("model.add_bias_linear", False),),
    "--position-embedding-type": (("model.position_embedding_type", None),),
    "--rotary-base": (("model.rotary_base", None),),
    "--qk-layernorm": (("model.qk_layernorm", True),),
    "--multi-latent-attention": (("model.multi_latent_attention", True),),
    "--q-lora-rank": (("model.q_lora_rank", None),),
    "--kv-lora-rank": (("model.kv_lora_rank", None),),
    "--qk-head-dim": (("model.qk_head_dim", None),),
    "--qk-pos-emb-head-dim": (("model.qk_pos_emb_head_dim", None),),
    "--v-head-dim": (("model.v_head_dim", None),),
    "--mtp-num-layers": (("model.mtp_num_layers", None),),
    "--untie-embeddings-and-output-weights": (("model.share_embeddings_and_output_weights", False),),
}

# a Megatron placeholder -> the Bridge key a real run fills in instead
PLACEHOLDER_KEYS = {"--data-path": "dataset.data_path", "--tokenizer-type": "tokenizer.tokenizer_type",
                    "--tokenizer-model": "tokenizer.tokenizer_model", "--train-iters": "train.train_iters",
                    "--lr": "optimizer.lr", "--min-lr": "optimizer.min_lr",
                    "--lr-decay-style": "scheduler.lr_decay_style", "--lr-warmup-iters": "scheduler.lr_warmup_iters",
                    "--weight-decay": "optimizer.weight_decay", "--clip-grad": "optimizer.clip_grad",
                    "--init-method-std": "model.init_method_std", "--save": "checkpoint.save",
                    "--save-interval": "checkpoint.save_interval",
                    "--load": "checkpoint.load"}

_PLAIN = re.compile(r"^[A-Za-z0-9_.+\-/:]*$")


def hydra_value(value: Any) -> str:
    """A value as Hydra's override grammar reads it: true/false, null, numbers, [a,b] lists, and
    a string quoted where it holds more than a plain word."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, (int, float)):
        return str(value)
    text = str(value)
    if _PLAIN.match(text) and text:
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def override(key: str, value: Any) -> str:
    """One `key=value` line, shell-quoted (a launcher takes it as one argument)."""
    return shlex.quote(f"{key}={hydra_value(value)}")


def _number(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def layout_lines(config: TrainingConfig, seq_length: int) -> list[str]:
    """The overrides of every TrainingConfig field Bridge has, then comments for those it lacks."""
    out, missing = [], []
    values = config.to_dict()
    values["etp"] = config.etp or config.tp  # Megatron's: ETP follows TP where unset
    values["seq_length"] = config.seq_length or seq_length
    values["recompute_modules"] = list(config.selective_modules) or None
    values["overlap_p2p_comm"] = config.p2p_overlapped  # Megatron's: the interleaved schedule only
    for field, keys in LAYOUT_KEYS.items():
        value = values[field]
        if field in ("offload_modules", "cuda_graph_modules"):
            value = list(value) or None
        if field in DEFAULTED and value is None:
            out += [f"# {k}: the recipe's (the trials left it at Megatron's default)" for k in keys]
            continue
        out += [override(k, value) for k in keys]
        if field == "recompute_granularity" and value == "full":
            out.append(override("model.recompute_method", "uniform"))
        if field == "offload_modules":
            out.append(override("model.fine_grained_activation_offloading", bool(value)))
    if config.fp8_format:
        out.append(override("mixed_precision", FP8_RECIPES.get(config.fp8_recipe or "delayed", "bf16_mixed")))
        recipe = config.fp8_recipe or "delayed"
        out.append(f"# the trials' FP8: --fp8-format {config.fp8_format} --fp8-recipe {recipe}; "
                   "the recipe named sets its own format (mixed_precision.fp8): match it where they differ")
    else:
        out.append(override("mixed_precision", "bf16_mixed"))
    if config.fsdp:
        out += [override("dist.use_megatron_fsdp", True), override("ddp.use_megatron_fsdp", True),
                override("ddp.data_parallel_sharding_strategy", config.fsdp_sharding),
                override("checkpoint.ckpt_format", "fsdp_dtensor")]
    flags = {f.field: f.flag for f in FLAGS}
    known = set(LAYOUT_KEYS) | set(PRECISION_FIELDS) | set(MEASURING_FIELDS) | set(FSDP_FIELDS)
    for field in values:
        if field not in known:
            rendered = next((f for f in FLAGS if f.field == field), None)
            shown = " ".join(rendered.render(getattr(config, field))) if rendered else ""
            missing.append(f"# no Bridge field: {flags.get(field, field)} ({shown or 'its default'}): set it on the "
                           "recipe's model provider or launcher where your Bridge has it")
    return out + missing


def arch_lines(model_argv: list[str]) -> list[str]:
    """The model's architecture flags as overrides, commented: a Bridge recipe of the model sets
    them itself; uncomment them where no recipe of this model exists."""
    out = []
    for flag, values in groups(model_argv):
        if flag not in ARCH_KEYS:
            out.append(f"# no Bridge field: {shlex.join([flag, *values])}")
            continue
        for key, switch in ARCH_KEYS[flag] or ():
            value = switch if switch is not None else _number(values[0]) if values else True
            out.append("# " + override(key, value))
    return out


def bridge_text(c: Chosen) -> str:
    """The chosen trial as Megatron-Bridge overrides, one a line, grouped, with comments."""
    config = c.config
    model = c.exp.model
    env = config_env(config.to_dict(), c.exp.cluster)
    lines = [f"# moetune export (Megatron-Bridge overrides): study {c.study.name}, trial {c.view.trial.number}",
             "# One override a line, shell-quoted; pass them after your recipe, e.g. grep -v '^#' bridge.txt "
             "| xargs python scripts/training/run_recipe.py --recipe RECIPE",
             "# Layout and every fix the study kept:"]
    lines += layout_lines(config, model.seq_length)
    lines += ["", f"# The model ({model.name}): your model's recipe sets these; uncomment where it has none:"]
    lines += arch_lines(model.to_args())
    lines += ["", "# Fill in (the trials ran with stand-ins, left out here):"]
    lines += [f"# {PLACEHOLDER_KEYS[flag]}=<{meta}>  ({what})" for flag, meta, what in PLACEHOLDERS
              if flag in PLACEHOLDER_KEYS]
    if config.force_balance:
        flag = "--moe-router-force-load-balancing"
        lines.append(f"# left out: {flag}: {MEASURING[flag].why}")
    if env:
        lines += ["", "# The environment the trials' jobs exported (set it in your launcher):"]
        lines += [f"# {k}={v}" for k, v in sorted(env.items())]
    return "\n".join(map(one_line, lines)) + "\n"
