"""The trial bank's configs: moe_proxy's baseline and its knobs, first those that run without
Transformer Engine on the GPU machine, then (`te_*`) those that need it
(benchmarks/device_setup.sh te). `python benchmarks/device/bank_configs.py [GROUP]` prints one line per
config: NAME, GPUS, then the shell-quoted Megatron argv."""
import shlex
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import checkout  # noqa: E402,F401  (moetune from this checkout)
from moetune.experiment.config import TrainingConfig, run_args  # noqa: E402
from moetune.experiment.model import ModelArch  # noqa: E402

EXP = yaml.safe_load((Path(__file__).resolve().parents[2] / "experiments/moe_proxy.yaml").read_text())
MODEL = ModelArch.from_dict(EXP["model"])
BASE = TrainingConfig.from_dict(EXP["baseline"])

# (name, changes from the baseline). 2-GPU configs; names ending in _1gpu run on one GPU.
CONFIGS = [
    ("baseline", {}),
    ("allgather", {"dispatcher": "allgather"}),
    ("ep_overlap", {"overlap_ep_a2a": True}),
    ("mbs1", {"micro_batch": 1}),
    ("mbs4", {"micro_batch": 4}),
    ("mbs8", {"micro_batch": 8}),
    ("seq1024", {"seq_length": 1024}),
    ("seq4096", {"seq_length": 4096}),
    ("seq4096_mbs4", {"seq_length": 4096, "micro_batch": 4}),
    ("manual_gc", {"manual_gc": True}),
    ("recompute_mlp", {"recompute_granularity": "selective", "recompute_modules": ["moe"]}),
    ("recompute_full", {"recompute_granularity": "full", "recompute_num_layers": 1}),
    ("force_balance", {"force_balance": True}),
    ("router_fp32", {"router_dtype": "fp32"}),
    ("ep_overlap_mbs4", {"overlap_ep_a2a": True, "micro_batch": 4}),
    ("tp2_sp_ep2", {"tp": 2, "sequence_parallel": True, "ep": 2, "etp": 1}),
    ("tp2_sp_ep1", {"tp": 2, "sequence_parallel": True, "ep": 1, "etp": 1}),
    ("ep1_dp2", {"ep": 1}),
    ("distopt", {"distributed_optimizer": True}),
    ("distopt_overlap", {"distributed_optimizer": True, "overlap_grad_reduce": True,
                         "overlap_param_gather": True}),
    ("allgather_mbs4", {"dispatcher": "allgather", "micro_batch": 4}),
    ("mbs16_oom", {"micro_batch": 16, "seq_length": 8192}),
    ("seq16384_oom", {"seq_length": 16384, "micro_batch": 4}),
    ("mbs32_seq4096_oom", {"micro_batch": 32, "seq_length": 4096, "global_batch": 64}),
    ("manual_gc_mbs4", {"manual_gc": True, "micro_batch": 4}),
    ("cuda_graph_attn", {"cuda_graph_impl": "local", "cuda_graph_modules": ["attn"]}),
    ("overlap_gc_mbs4", {"overlap_ep_a2a": True, "manual_gc": True, "micro_batch": 4}),
    # the flex dispatcher with DeepEP / HybridEP (deep_ep built by benchmarks/device_setup.sh)
    ("flex_deepep", {"dispatcher": "flex", "flex_backend": "deepep"}),
    # HybridEP takes float32 router probabilities only (Megatron warns, then the run crashes)
    ("flex_hybridep", {"dispatcher": "flex", "flex_backend": "hybridep", "router_dtype": "fp32"}),
    ("flex_deepep_mbs4", {"dispatcher": "flex", "flex_backend": "deepep", "micro_batch": 4}),
    ("flex_hybridep_mbs4", {"dispatcher": "flex", "flex_backend": "hybridep", "router_dtype": "fp32",
                            "micro_batch": 4}),
    ("flex_deepep_overlap", {"dispatcher": "flex", "flex_backend": "deepep", "overlap_ep_a2a": True}),
    # one GPU each (EP=1, DP=1): run two at a time
    ("baseline_1gpu", {"ep": 1, "global_batch": 8}),
    ("mbs4_1gpu", {"ep": 1, "global_batch": 8, "micro_batch": 4}),
    ("manual_gc_1gpu", {"ep": 1, "global_batch": 8, "manual_gc": True}),
    ("recompute_moe_1gpu", {"ep": 1, "global_batch": 8, "recompute_granularity": "selective",
                            "recompute_modules": ["moe"]}),
    ("seq1024_1gpu", {"ep": 1, "global_batch": 8, "seq_length": 1024}),
    ("seq4096_1gpu", {"ep": 1, "global_batch": 8, "seq_length": 4096}),
    ("mbs8_1gpu", {"ep": 1, "global_batch": 8, "micro_batch": 8}),
]

# With Transformer Engine (TE 2.20.2 built by benchmarks/device_setup.sh te). `te_baseline` is the
# baseline on the TE layer spec; the others add, to TE with grouped GEMM (`te_gg`), one fix each from
# ../shared/guidance: EP overlap without and with delayed wgrad, TE-scoped CUDA graphs on the
# modules dropless MoE allows, FP8 blockwise, the flex dispatcher, moe_act recompute.
TE = {"transformer_impl": "transformer_engine"}
TE_GG = {**TE, "grouped_gemm": True}
TE_CONFIGS = [
    ("te_baseline", TE),
    ("te_gg", TE_GG),
    ("te_gg_overlap", {**TE_GG, "overlap_ep_a2a": True}),
    ("te_gg_overlap_wgrad", {**TE_GG, "overlap_ep_a2a": True, "delay_wgrad": True}),
    ("te_gg_graphs", {**TE_GG, "cuda_graph_impl": "transformer_engine",
                      "cuda_graph_modules": ["attn", "moe_router", "moe_preprocess"]}),
    ("te_gg_fp8", {**TE_GG, "fp8_format": "e4m3", "fp8_recipe": "blockwise"}),
    ("te_gg_deepep", {**TE_GG, "dispatcher": "flex", "flex_backend": "deepep"}),
    ("te_gg_recompute_act", {**TE_GG, "recompute_granularity": "selective",
                             "recompute_modules": ["moe_act"]}),
    ("te_gg_hybridep", {**TE_GG, "dispatcher": "flex", "flex_backend": "hybridep", "router_dtype": "fp32"}),
]
CONFIGS += TE_CONFIGS


def argv(changes: dict) -> list[str]:
    cfg = BASE.replace(**changes)
    return cfg.to_args(MODEL, has_apex=False) + run_args()  # the GPU machine has no apex


if __name__ == "__main__":
    only = set(sys.argv[1:])
    for name, changes in CONFIGS:
        if only and name not in only:
            continue
        print(name, 1 if name.endswith("_1gpu") else 2, shlex.join(argv(changes)))
