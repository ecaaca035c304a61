"""moetune's memory estimate beside Megatron's own theoretical figure, two layouts per model.

    .venv/bin/python benchmarks/memory_table.py      # needs .venv-megatron (scripts/megatron-venv)

Writes docs/memory.md and benchmarks/results/memory.json.
"""
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import checkout  # noqa: E402,F401  (moetune from this checkout)

from moetune.pipeline.spec.config import run_args  # noqa: E402
from moetune.pipeline.spec.experiment import load_experiment  # noqa: E402
from moetune.pipeline.spec.megatron_validate import theoretical_memory  # noqa: E402
from moetune.pipeline.spec.memory import estimate  # noqa: E402

# (model, label, changes from the experiment's baseline)
LAYOUTS = [
    ("qwen3_235b", "baseline TP2 PP2 EP32", {}),
    ("qwen3_235b", "TP4 PP2 EP64, no dist. opt.", {"tp": 4, "ep": 64, "distributed_optimizer": False}),
    ("qwen3_30b_a3b", "baseline TP1 EP16", {}),
    ("qwen3_30b_a3b", "TP2 SP EP8 PP2", {"tp": 2, "sequence_parallel": True, "ep": 8, "pp": 2}),
    ("deepseek_v3", "baseline TP2 PP16 EP64", {}),
    ("deepseek_v3", "TP4 PP16 EP32", {"tp": 4, "ep": 32}),
    ("mixtral_8x7b", "baseline PP4 EP8", {}),
    ("mixtral_8x7b", "TP2 SP PP2 EP8", {"tp": 2, "sequence_parallel": True, "pp": 2}),
    ("mixtral_8x22b", "baseline TP2 PP8 EP8", {}),
    ("mixtral_8x22b", "TP4 PP4 EP8, no dist. opt.", {"tp": 4, "pp": 4, "distributed_optimizer": False}),
    # Megatron's SP formula (Table 2's case: SP + selective recompute of core attention)
    ("qwen3_235b", "TP4 SP PP2 EP64, recompute core_attn", {"tp": 4, "ep": 64, "recompute_granularity": "selective",
                                                          "recompute_modules": ("core_attn",)}),
    ("mixtral_8x22b", "TP2 SP PP8 EP8, recompute core_attn", {"recompute_granularity": "selective",
                                                             "recompute_modules": ("core_attn",)}),
]


def main():
    rows, argvs, worlds = [], [], []
    for name, label, changes in LAYOUTS:
        e = load_experiment(name)
        cfg = e.baseline.replace(**changes)
        argvs.append(cfg.to_args(e.model) + run_args())
        worlds.append(e.cluster.gpus)
        rows.append((name, label, e, cfg))
    theirs = theoretical_memory(argvs, worlds)
    out, lines = [], [
        "# Memory estimate vs Megatron's theoretical figure",
        "",
        "Made by `benchmarks/memory_table.py`: moetune's estimate (`pipeline/memory.py`) beside Megatron-Core",
        "0.19.2's `megatron.training.theoretical_memory_usage.report_theoretical_memory` for the same argv (run",
        "on the CPU in `.venv-megatron`), per GPU of the most loaded pipeline stage, GiB.",
        "",
        "| model | layout | GPUs | weights+grads+optimizer: moetune | Megatron | diff "
        "| activations, Megatron's scope: moetune | Megatron | total, Megatron's scope: moetune | Megatron | diff "
        "| MoE-aware total: moetune | vs Megatron |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (name, label, e, cfg), t in zip(rows, theirs):
        if not isinstance(t, list):
            raise SystemExit(f"{name} {label}: Megatron refused: {t}")
        est = estimate(e.model, cfg, e.cluster.gpus)
        dense = estimate(e.model, cfg, e.cluster.gpus, routing=False)
        mw, ma = t[0] / 1024, t[1] / 1024
        ours_total = est.model_state_gb + est.activations_gb
        scope_total = dense.model_state_gb + dense.activations_gb
        d_state = (est.model_state_gb - mw) / mw
        d_scope = (scope_total - (mw + ma)) / (mw + ma)
        d_total = (ours_total - (mw + ma)) / (mw + ma)
        out.append({"model": name, "layout": label, "gpus": e.cluster.gpus, "args": argvs[len(out)],
                    "ours_state_gb": est.model_state_gb, "megatron_state_gb": mw,
                    "ours_dense_act_gb": dense.activations_gb, "megatron_act_gb": ma,
                    "ours_moe_act_gb": est.activations_gb, "state_diff": d_state,
                    "scope_total_diff": d_scope, "moe_total_diff": d_total})
        lines.append(f"| {name} | {label} | {e.cluster.gpus} | {est.model_state_gb:.1f} | {mw:.1f} | {d_state:+.1%} | "
                     f"{dense.activations_gb:.1f} | {ma:.1f} | {scope_total:.1f} | {mw + ma:.1f} | {d_scope:+.1%} | "
                     f"{ours_total:.1f} | {d_total:+.1%} |")
    lines += ["", "Against a measurement: every completed `moe_proxy` trial of the GPU trial bank (transformer_impl",
              "local, i.e. unfused attention; H200, 1 or 2 GPUs), measured peak = Megatron's `max allocated` (the",
              "PyTorch allocator's peak: no CUDA context, no NCCL buffers), GiB:", "",
              "| trial | GPUs | measured | moetune MoE-aware (no fixed overhead) | diff | Megatron | diff |",
              "|---|---|---|---|---|---|---|"]
    bank = [json.loads(l) for l in (REPO / "benchmarks/trial_bank/bank.jsonl").read_text().splitlines() if l]
    proxy = load_experiment("moe_proxy")
    picked = [b for b in bank if b["state"] == "COMPLETED" and b["peak_memory_gb"]]
    measured = theoretical_memory([b["args"] for b in picked], [b["gpus"] for b in picked])
    from moetune.pipeline.spec.config import TrainingConfig
    ours_d, theirs_d = [], []
    for b, t in zip(picked, measured):
        est = estimate(proxy.model, TrainingConfig.from_dict(b["config"]), b["gpus"])
        ours, meg, peak = est.model_state_gb + est.activations_gb, sum(t[:2]) / 1024, b["peak_memory_gb"]
        ours_d.append((ours - peak) / peak)
        theirs_d.append((meg - peak) / peak)
        lines.append(f"| {b['name']} | {b['gpus']} | {peak:.1f} | {ours:.1f} | {ours_d[-1]:+.1%} | "
                     f"{meg:.1f} | {theirs_d[-1]:+.1%} |")
    worst = lambda d: max(d, key=abs)
    lines += ["", f"{len(picked)} trials: moetune within {min(ours_d):+.0%}..{max(ours_d):+.0%} of the measured peak "
              f"(worst {worst(ours_d):+.1%}), Megatron's figure within {min(theirs_d):+.0%}..{max(theirs_d):+.0%}."]
    lines += [
        "",
        "What Megatron's figure includes: weights and optimizer states (`compute_weight_and_optimizer_memory`:",
        "18 B per parameter, or 6 + 12/DP with the distributed optimizer, experts over EDP; the first stage with",
        "the embedding; MTP layers counted on it) and activations by Korthikanti et al. 2022, Table 2, for the",
        "first pipeline stage with PP micro batches in flight: `s·b·h·(18 + 4·ffn/h)/TP` per layer with SP and",
        "selective recompute, else `s·b·h·(10 + 24/TP)` × 1.05. Every layer is priced as a dense layer of",
        "`ffn_hidden_size`: no routing, no top-k copies, no recompute modules, no CP, no offload, no attention",
        "score matrix, no CUDA context or NCCL buffers.",
        "",
        "Weights, gradients and optimizer states use Megatron's accounting and agree on every row. \"Megatron's",
        "scope\" is moetune's own per-layer formula with every layer priced as that dense layer",
        "(`estimate(..., routing=False)`): like with like, it lands within 10 % of Megatron's total on 9 of",
        "12 rows and on at least two layouts of every model. The three beyond 10 % (-11 % to -16 %) are layouts",
        "with SP but without selective recompute, where Megatron switches to its no-SP formula",
        "`s·b·h·(10 + 24/TP)`, which neither splits the 10·sbh by TP nor looks at `ffn_hidden_size`; the same",
        "models with SP and selective recompute (Megatron's Table 2 case, the last two rows) agree within 2 %.",
        "The MoE-aware estimate, the one `moetune plan` uses, adds what a MoE layer really keeps: the",
        "top-k copies of each token an expert-parallel rank holds after dispatch, the router's scores and the",
        "shared experts, and for unfused attention the score matrix; it is higher than Megatron's figure for",
        "top-8 routing. The measurements on the proxy show which is closer (see the range above); the",
        "MoE-aware estimate runs a little low, most where the EP overlap adds its buffers. `moetune plan` adds 3 GiB of fixed",
        "overhead (CUDA context, NCCL buffers) to its feasibility check, not shown here.",
    ]
    (REPO / "docs" / "memory.md").write_text("\n".join(lines) + "\n")
    (REPO / "benchmarks" / "results").mkdir(parents=True, exist_ok=True)
    (REPO / "benchmarks" / "results" / "memory.json").write_text(json.dumps(out, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
