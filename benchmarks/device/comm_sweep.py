"""The communication sweep around a single-host EP experiment's plain baseline
(experiments/qwen3_30b_a3b_ep4.yaml on 4 GPUs, qwen3_30b_a3b_ep8.yaml on 8): the dispatchers
(alltoall, DeepEP, HybridEP), EP all-to-all overlap with and without delayed wgrad, TE CUDA graph
scopes, EP against EP/2 with expert tensor parallelism 2 (parallel folding), micro batch 2, permute
and router fusion, recompute (norms and activation; the MoE layer), two pipeline stages with 1, 2
and 4 virtual stages each (moe-dispatcher-selection.txt, moe-comm-overlap.txt, megatron-core-moe-readme.md);
then the slow-link runs: NCCL_P2P_DISABLE=1 sends NCCL's traffic through host memory (23-30 GB/s on
the 4-GPU H200 host, about half a 400 Gb/s NIC: shared/device-notes.md), a cross-node-like link for
NCCL's paths only; DeepEP and HybridEP keep NVLink under it, so no dispatcher is compared there.

`python benchmarks/device/comm_sweep.py EXPERIMENT [NAME ...]` prints one line per config: NAME,
GPUS, ENV (KEY=VALUE,... or -: the variables moetune's job script exports for that config,
experiment/environment.py, then the run's own), then the shell-quoted Megatron argv; the runs named,
in the order named, else all."""
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import checkout  # noqa: E402,F401  (moetune from this checkout)

from moetune.experiment.config import TrainingConfig, run_args  # noqa: E402
from moetune.experiment.environment import config_env  # noqa: E402
from moetune.experiment.schema import Experiment, load_experiment  # noqa: E402

SLOW_LINK = {"NCCL_P2P_DISABLE": "1"}


def sweep(exp: Experiment) -> list[tuple[str, dict, dict]]:
    """(name, changes from the baseline, environment) for each run of the sweep. HybridEP takes
    float32 router probabilities only; the baselines route in fp32 already."""
    ep = exp.baseline.ep
    graphs = {"cuda_graph_impl": "transformer_engine"}
    nvlink = [
        ("baseline", {}),
        ("deepep", {"dispatcher": "flex", "flex_backend": "deepep"}),
        ("hybridep", {"dispatcher": "flex", "flex_backend": "hybridep"}),
        ("overlap", {"overlap_ep_a2a": True}),
        ("overlap_wgrad", {"overlap_ep_a2a": True, "delay_wgrad": True}),
        ("hybridep_overlap", {"dispatcher": "flex", "flex_backend": "hybridep", "overlap_ep_a2a": True}),
        ("graphs_attn", {**graphs, "cuda_graph_modules": ["attn"]}),
        ("graphs_attn_router", {**graphs, "cuda_graph_modules": ["attn", "moe_router", "moe_preprocess"]}),
        (f"ep{ep // 2}_etp2", {"ep": ep // 2, "etp": 2}),
        ("mbs2", {"micro_batch": 2}),
        # micro batch 4: fewer, larger kernels, so the GPU, not the host, sets the pace and an
        # overlap has compute to hide the all-to-all behind (the A/B of its hidden share)
        ("mbs4", {"micro_batch": 4}),
        ("mbs4_overlap", {"micro_batch": 4, "overlap_ep_a2a": True}),
        ("mbs4_overlap_wgrad", {"micro_batch": 4, "overlap_ep_a2a": True, "delay_wgrad": True}),
        ("mbs4_hybridep", {"micro_batch": 4, "dispatcher": "flex", "flex_backend": "hybridep"}),
        ("mbs4_deepep", {"micro_batch": 4, "dispatcher": "flex", "flex_backend": "deepep"}),
        # TP 2 with sequence parallel (EP 4 folded over TP x DP), then its TP all-gathers and
        # reduce-scatters overlapped by TE's userbuffers: the TP-comm overlap A/B
        ("tp2_mbs4", {"tp": 2, "sequence_parallel": True, "micro_batch": 4}),
        ("tp2_mbs4_tpoverlap", {"tp": 2, "sequence_parallel": True, "micro_batch": 4,
                                "tp_comm_overlap": True}),
        ("fusions", {"permute_fusion": True, "router_fusion": True}),
        # what recompute runs again, at micro batch 4 beside mbs4: the norms' and activation's
        # forward, then the whole MoE layer's, its dispatch and combine included (a third pass)
        ("mbs4_recompute_act_norm", {"micro_batch": 4, "recompute_granularity": "selective",
                                     "recompute_modules": ["moe_act", "layernorm"]}),
        ("mbs4_recompute_moe", {"micro_batch": 4, "recompute_granularity": "selective",
                                "recompute_modules": ["moe"]}),
    ]
    if exp.cluster.gpus >= 4:  # two stages at half the EP: what a virtual stage costs beyond its bubble
        nvlink += [(f"pp2{f'_vpp{v}' if v else ''}", {"pp": 2, "ep": ep // 2, **({"vpp": v} if v else {})})
                   for v in (None, 2, 4)]
    slow = [("slow_" + name, changes, SLOW_LINK) for name, changes in nvlink
            if name in ("baseline", "overlap", "overlap_wgrad", "mbs2", "mbs4", "mbs4_overlap",
                        "mbs4_overlap_wgrad")]
    # the host's launch cost against the CPUs a rank has: the micro batch 1 baseline (the host
    # sets its pace) with the job pinned to 4 and 8 of the host's cores a rank (run.sh: CPUS)
    gpus = exp.cluster.gpus
    pinned = [(f"baseline_cpus{c}", {}, {"CPUS": str(c * gpus)}) for c in (4, 8)]
    runs = [(f"ep{ep}_{name}", changes, {}) for name, changes in nvlink] + \
        [(f"ep{ep}_{name}", changes, env) for name, changes, env in slow + pinned]
    # each run again with routing forced to balance (--moe-router-force-load-balancing), as
    # NVIDIA's performance runs route and as the step-time model prices: a fresh router's
    # imbalance is then out of the A/B
    return runs + [(f"{name}_balanced", {**changes, "force_balance": True}, env)
                   for name, changes, env in runs]


def config(exp: Experiment, changes: dict) -> TrainingConfig:
    return exp.baseline.replace(**changes)


def run_env(exp: Experiment, cfg: TrainingConfig, env: dict) -> dict[str, str]:
    """What a run exports: the variables a trial of this config gets from moetune's job script
    (CUDA_DEVICE_MAX_CONNECTIONS above one for the EP overlap and the flex dispatchers, which
    Megatron's overlap needs; the SM margins and HybridEP's domain size), then the run's own."""
    return {**config_env(cfg.to_dict(), exp.cluster), **env}


def argv(exp: Experiment, cfg: TrainingConfig) -> list[str]:
    return cfg.to_args(exp.model, has_apex=exp.cluster.has_apex) + run_args()


def main(args: list[str]) -> int:
    if not args:
        print("usage: comm_sweep.py EXPERIMENT [NAME ...]", file=sys.stderr)
        return 2
    exp = load_experiment(args[0])
    runs = sweep(exp)
    unknown = set(args[1:]) - {name for name, _, _ in runs}
    if unknown:
        print(f"comm_sweep: no run named {', '.join(sorted(unknown))}; runs: "
              f"{', '.join(n for n, _, _ in runs)}", file=sys.stderr)
        return 2
    by_name = {name: (changes, env) for name, changes, env in runs}
    # in the order named (the runs that matter most first, while device time lasts), else all
    for name in args[1:] or list(by_name):
        changes, env = by_name[name]
        cfg = config(exp, changes)
        env_word = ",".join(f"{k}={v}" for k, v in run_env(exp, cfg, env).items()) or "-"
        print(name, exp.cluster.gpus, env_word, shlex.join(argv(exp, cfg)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
