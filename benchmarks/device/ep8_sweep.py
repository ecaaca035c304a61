"""The 8-GPU sweep around experiments/qwen3_30b_a3b_ep8.yaml's plain baseline: the
dispatchers (alltoall, DeepEP, HybridEP), EP all-to-all overlap with and without delayed wgrad, TE
CUDA graph scopes, EP 8 against EP 4 with expert tensor parallelism (parallel folding), and micro
batch (moe-dispatcher-selection.txt, moe-comm-overlap.txt, megatron-core-moe-readme.md).
`python benchmarks/device/ep8_sweep.py` prints one line per config: NAME, GPUS, then the
shell-quoted Megatron argv (what benchmarks/device/run.sh's `bank` reads, with this list)."""
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import checkout  # noqa: E402,F401  (moetune from this checkout)

from moetune.experiment.config import TrainingConfig, run_args  # noqa: E402
from moetune.experiment.schema import load_experiment  # noqa: E402

EXP = load_experiment("qwen3_30b_a3b_ep8")
GPUS = EXP.cluster.gpus

# (name, changes from the baseline). HybridEP takes float32 router probabilities only; the
# baseline routes in fp32 already.
SWEEP = [
    ("ep8_baseline", {}),
    ("ep8_deepep", {"dispatcher": "flex", "flex_backend": "deepep"}),
    ("ep8_hybridep", {"dispatcher": "flex", "flex_backend": "hybridep"}),
    ("ep8_overlap", {"overlap_ep_a2a": True}),
    ("ep8_overlap_wgrad", {"overlap_ep_a2a": True, "delay_wgrad": True}),
    ("ep8_graphs_attn", {"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ["attn"]}),
    ("ep8_graphs_attn_router", {"cuda_graph_impl": "transformer_engine",
                                "cuda_graph_modules": ["attn", "moe_router", "moe_preprocess"]}),
    ("ep4_etp2", {"ep": 4, "etp": 2}),
    ("ep8_mbs2", {"micro_batch": 2}),
    ("ep8_hybridep_overlap", {"dispatcher": "flex", "flex_backend": "hybridep", "overlap_ep_a2a": True}),
]


def config(changes: dict) -> TrainingConfig:
    return EXP.baseline.replace(**changes)


def argv(cfg: TrainingConfig) -> list[str]:
    return cfg.to_args(EXP.model, has_apex=EXP.cluster.has_apex) + run_args()


if __name__ == "__main__":
    for name, changes in SWEEP:
        print(name, GPUS, shlex.join(argv(config(changes))))
