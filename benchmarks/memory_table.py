"""moetune's memory estimate beside the measured peak of ten production layouts on one GPU (the fit
lease, benchmarks/fit_lease/) and beside Megatron's own theoretical figure, two layouts per model.

    .venv/bin/python benchmarks/memory_table.py      # needs .venv-megatron (scripts/megatron-venv)

Writes docs/memory.md, benchmarks/results/memory.json and benchmarks/results/memory_fit.json.
With --layouts and --results it only prints estimate vs measured for those fit entries (any file
in layouts.json's format, e.g. the unseen models' benchmarks/fit_lease/unseen.json and the
device's unseen_results.jsonl), every rank at its own pipeline stage, and writes nothing:

    .venv/bin/python benchmarks/memory_table.py --layouts benchmarks/fit_lease/unseen.json \
        --results benchmarks/fit_lease/unseen_results.jsonl
"""
import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import checkout  # noqa: E402,F401  (moetune from this checkout)

from moetune.experiment.config import run_args  # noqa: E402
from moetune.experiment.schema import load_experiment  # noqa: E402
from moetune.experiment.megatron_validate import theoretical_memory  # noqa: E402
from moetune.estimate.memory import estimate  # noqa: E402

# qwen3_235b's former baseline (TP2 PP2 EP32, evenly split, no recompute), which these rows start from:
# its experiment now ships a virtual-stage layout Megatron's theoretical figure does not take
OLD_QWEN = {"pp": 2, "vpp": None, "account_for_embedding": False, "account_for_loss": False,
            "recompute_granularity": None, "recompute_modules": ()}
# (model, label, changes from the experiment's baseline)
LAYOUTS = [
    ("qwen3_235b", "baseline TP2 PP2 EP32", OLD_QWEN),
    ("qwen3_235b", "TP4 PP2 EP64, no dist. opt.", {**OLD_QWEN, "tp": 4, "ep": 64, "distributed_optimizer": False}),
    ("qwen3_30b_a3b", "baseline TP1 EP16", {}),
    ("qwen3_30b_a3b", "TP2 SP EP8 PP2", {"tp": 2, "sequence_parallel": True, "ep": 8, "pp": 2}),
    ("deepseek_v3", "baseline TP2 PP16 EP64", {}),
    ("deepseek_v3", "TP4 PP16 EP32", {"tp": 4, "ep": 32}),
    ("mixtral_8x7b", "baseline PP4 EP8", {}),
    ("mixtral_8x7b", "TP2 SP PP2 EP8", {"tp": 2, "sequence_parallel": True, "pp": 2}),
    ("mixtral_8x22b", "baseline TP2 PP8 EP8", {}),
    ("mixtral_8x22b", "TP4 PP4 EP8, no dist. opt.", {"tp": 4, "pp": 4, "distributed_optimizer": False}),
    # Megatron's SP formula (Table 2's case: SP + selective recompute of core attention)
    ("qwen3_235b", "TP4 SP PP2 EP64, recompute core_attn", {**OLD_QWEN, "tp": 4, "ep": 64,
                                                          "recompute_granularity": "selective",
                                                          "recompute_modules": ("core_attn",)}),
    ("mixtral_8x22b", "TP2 SP PP8 EP8, recompute core_attn", {"recompute_granularity": "selective",
                                                             "recompute_modules": ("core_attn",)}),
]


FIT = REPO / "benchmarks" / "fit_lease"


def model_of(lay: dict):
    """The entry's model: its experiment where moetune ships one, else read back from its argv
    (a model imported from a Hugging Face config, as benchmarks/fit_lease/unseen.py writes them)."""
    from moetune.experiment.model import ModelArch
    from moetune.experiment.schema import list_experiments
    if lay["model"] in list_experiments():
        return load_experiment(lay["model"]).model
    return ModelArch.from_args(lay["argv"], lay["model"])


def fit_rows(layouts_path: Path, results_path: Path | None) -> list[dict]:
    """Estimate vs measured peak for each fit entry: the estimate of the rank's own pipeline stage
    (Megatron's rank order puts the pipeline outermost) without the fixed overhead, measured =
    Megatron's max allocated (None where the results hold no successful run of it)."""
    from moetune.experiment.config import TrainingConfig
    results = {}
    if results_path and results_path.exists():
        results = {r["name"]: r for r in (json.loads(line) for line in results_path.read_text().splitlines()
                                          if line.strip())}
    out = []
    for lay in json.loads(layouts_path.read_text()):
        cfg = TrainingConfig.from_dict(lay["config"])
        stage = lay["rank"] // (lay["world_size"] // max(cfg.pp, 1))
        est = estimate(model_of(lay), cfg, lay["world_size"], stage=stage)
        ours = est.model_state_gb + est.activations_gb
        r = results.get(lay["name"]) or {}
        peak = r["max_allocated_mb"] / 1024 if r.get("max_allocated_mb") and not r.get("oom") else None
        out.append({"layout": lay["name"], "model": lay["model"], "kind": lay["kind"], "gpus": lay["world_size"],
                    "rank": lay["rank"], "stage": stage, "config": cfg, "measured_gb": peak,
                    "reserved_gb": r["max_reserved_mb"] / 1024 if r.get("max_reserved_mb") else None,
                    "estimate_gb": ours, "state_gb": est.model_state_gb, "activations_gb": est.activations_gb,
                    "error": (ours - peak) / peak if peak else None, "iteration_ms": r.get("iteration_ms") or [],
                    "failure": "out of memory" if r.get("oom") else ("failed, no peak" if r.get("error") else None)})
    return out


def rows_table(rows: list[dict]) -> list[str]:
    """Estimate vs measured, one line a rank, GiB."""
    lines = ["| entry | GPUs | rank (stage) | TP | PP | EP | micro batch | recompute | measured max allocated "
             "| estimate (state + activations) | error |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["config"]
        measured = f"{r['measured_gb']:.1f}" if r["measured_gb"] else (r["failure"] or "not measured")
        err = f"{r['error']:+.1%}" if r["error"] is not None else "-"
        lines.append(f"| {r['layout']} | {r['gpus']} | {r['rank']} ({r['stage']}) | {c.tp} | {c.pp} | {c.ep} | "
                     f"{c.micro_batch} | {','.join(c.recompute_modules) or '-'} | {measured} | "
                     f"{r['estimate_gb']:.1f} ({r['state_gb']:.1f} + {r['activations_gb']:.1f}) | {err} |")
    return lines


def fit_section() -> tuple[list[str], list[dict]]:
    """Estimate vs measured peak for the fit lease's layouts: rank 0 (the first pipeline stage) and
    each layout's last stage."""
    rows = fit_rows(FIT / "layouts.json", FIT / "results.jsonl")
    results = {r["name"]: r for r in map(json.loads, (FIT / "results.jsonl").read_text().splitlines())}
    lines = [
        "## Estimate vs measured: ten production layouts, one rank each on one H200",
        "",
        "The five production experiments' baselines and `moetune plan`'s first choice for each (at the time",
        "of measuring), rendered here by `TrainingConfig.to_args` + `run_args`",
        "as a trial gets them (`benchmarks/fit_lease/layouts.py` → `layouts.json`), run on one GPU under",
        "megatron-core's fake process group: measured = Megatron's `max allocated` after iteration 2 (the",
        "optimizer states exist), estimate = `moetune/estimate/memory.py`'s `estimate()` without the fixed 3 GiB",
        "(`estimate_gb` in `moetune plan --format json`). GiB.",
        "",
        "| model | layout | GPUs | TP | PP | EP | recompute | measured max allocated | max reserved "
        "| estimate | error | iteration times (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    out, errs = [], []
    for r in rows:
        if r["rank"] != 0:
            continue
        cfg = r["config"]
        errs.append(r["error"])
        out.append({k: r[k] for k in ("layout", "gpus", "measured_gb", "reserved_gb", "estimate_gb", "error",
                                      "iteration_ms")})
        lines.append(f"| {r['model']} | {r['kind']} | {r['gpus']} | {cfg.tp} | {cfg.pp} | {cfg.ep} | "
                     f"{','.join(cfg.recompute_modules) or '-'} | {r['measured_gb']:.1f} | {r['reserved_gb']:.1f} | "
                     f"{r['estimate_gb']:.1f} | {r['error']:+.1%} | "
                     f"{' / '.join(f'{ms:.0f}' for ms in r['iteration_ms'])} |")
    lines += ["", f"{len(errs)} layouts: the estimate within {min(errs):+.1%}..{max(errs):+.1%} of the measured peak "
              f"(worst {max(errs, key=abs):+.1%}).", "",
              "The last pipeline stage's first rank (DP and TP rank 0, so that Megatron prints its memory report)",
              "of each layout with PP > 1, measured the same way and estimated for that stage (its own layers,",
              "one micro batch in flight, the output layer and loss, and DeepSeek-V3's MTP layer):", "",
              "| layout | rank | measured max allocated | estimate | error | rank 0's | iteration times (ms) |",
              "|---|---|---|---|---|---|---|"]
    last = [r for r in rows if r["rank"] != 0]
    for r in last:
        r0 = results[r["layout"].rsplit("-r", 1)[0] + "-r0"]
        out.append({k: r[k] for k in ("layout", "gpus", "measured_gb", "reserved_gb", "estimate_gb", "error",
                                      "iteration_ms")})
        lines.append(f"| {r['layout'].rsplit('-r', 1)[0]} | {r['rank']} of {r['gpus']} | {r['measured_gb']:.1f} | "
                     f"{r['estimate_gb']:.1f} | {r['error']:+.1%} | {r0['max_allocated_mb'] / 1024:.1f} | "
                     f"{' / '.join(f'{ms:.0f}' for ms in r['iteration_ms'])} |")
    lines += ["", f"{len(last)} last stages: the estimate within {min(r['error'] for r in last):+.1%}.."
              f"{max(r['error'] for r in last):+.1%} of the measured peak."]
    falling = sum(all(a > b for a, b in zip(r["iteration_ms"], r["iteration_ms"][1:])) for r in results.values())
    worst_warm = max((r["iteration_ms"][0] / r["iteration_ms"][-1], f"{n}: {r['iteration_ms'][0]:.0f} → "
                      f"{r['iteration_ms'][-1]:.0f} ms") for n, r in results.items())
    lines += [
        "",
        "How it was measured (2026-11-23): one NVIDIA H200 (143771 MiB, driver 580.159.04), torch 2.11.0+cu130,",
        "megatron-core 0.19.2 (the registry's cp312 wheel), Transformer Engine 2.20.2 (the registry's",
        "CUDA 13 core, sm_90 code kept, and its PyTorch extension built there by",
        "`benchmarks/device_setup.sh te` from `.deps/tecarry`, made here by `benchmarks/device/te_bundle.sh`).",
        "`bash benchmarks/device/fit.sh start` sets that up and runs `benchmarks/device/fit.py`, which starts,",
        "for each layout of `layouts.json`, one process without torchrun:",
        "`WORLD_SIZE=<the job's GPUs> RANK=<rank> LOCAL_RANK=0 <the job's environment from moetune/experiment/environment.py>",
        "python3 -u moetune/workloads/train_moe.py <argv>`, the argv being the trial's plus `--no-gradient-accumulation-fusion`",
        "(no apex there), `--fake-process-group` (every collective and point-to-point transfer skipped: one",
        "rank's own memory and kernels at the production shapes), `--moe-expert-capacity-factor 1.0",
        "--moe-pad-expert-input-to-capacity` (the dropless alltoall dispatcher's token counts come from a",
        "collective the fake group skips; static routing pads every expert to a balanced load) and",
        "`--train-iters 3`. Each log's first line (`benchmarks/fit_lease/logs/*.log.xz`) holds the exact",
        "command; `results.jsonl` is the device's summary. No layout ran out of memory on the H200; the",
        "qwen3_235b baseline's 83.9 GiB would not fit an 80 GB H100, which `moetune plan qwen3_235b --baseline`",
        "now says.",
        "",
        "Iteration times are one rank's compute alone (no communication, no pipeline waiting), and with",
        f"3 iterations they are not steady: {falling} of {len(results)} ranks ran each iteration faster than the one",
        f"before (warm-up), iteration 1 to 3 by up to {worst_warm[0]:.1f}x ({worst_warm[1]}). They bound what a rank",
        "computes per step from above; judging a 5 % change needs more steady steps than this lease had.",
        "",
        "What the estimate counts (`moetune/estimate/activations.py`, no factor fitted to these runs): the",
        "first stage's own layers (an uneven pipeline's `--decoder-first-pipeline-num-layers`, the model's",
        "leading dense layers first: deepseek_v3's first stage holds its 3 dense layers only), MTP layers",
        "where they are built (the last stage, which then holds an input embedding too), MLA's",
        "down-projections replicated across TP (as Megatron builds them), and the activations tensor by",
        "tensor as megatron-core 0.19.2 keeps them with Transformer Engine, grouped GEMM and the alltoall",
        "dispatcher, read from its code:",
        "",
        "- Around attention and the MLP: the two norms' inputs and outputs (the input norm is fused into",
        "  the QKV projection, which keeps its output; `layernorm` recompute redoes the MoE layer's separate",
        "  pre-MLP norm, and MLA's input norm) and the two hidden-dropout masks (one byte an element:",
        "  Megatron's default dropout 0.1).",
        "- Attention (fused): Q and K after RoPE and V, the attention output (the projection's input: one",
        "  tensor), fp32 softmax statistics; QK norm keeps the unnormed Q and K too. MLA: the q and kv",
        "  latents and their norms' outputs (not split by TP), then Q = [q, q_rope], K and V of every",
        "  head, which `mla_up_proj` recompute drops. A sliding window or attention sinks change none of it.",
        "- MoE layer: one copy of the routed tokens, the sorted experts' input that fc1 keeps (the tokens",
        "  permuted for the all-to-all and the all-to-all's output are freed when the layer returns), fc1's",
        "  output (the activation's input), the activation's output (fc2's input, what `moe_act` recompute",
        "  drops), each copy's fp32 routing weight; the router's fp32 scores of the chosen experts (all",
        "  experts' with sigmoid scoring), its top-k and permutation indices; the shared experts' fc1",
        "  output and activation. One MoE layer's working copies once a stage, while it runs (alltoall:",
        "  permuted, dispatched, expert output, combined, four times the routed tokens; counted so for every",
        "  dispatcher, flex holding one fewer). The flex dispatcher (DeepEP, HybridEP) saves the same",
        "  tensors (not measured here: every fit-lease layout ran alltoall).",
        "- Unfused attention keeps the score matrix: Megatron's local attention 5 B a score; TE falls back",
        "  to its unfused attention (fp32 softmax kept: 7 B a score) for windowed layers of a model with",
        "  sinks under attention dropout (flash attention takes no sinks, cuDNN's fused attention no window",
        "  with dropout; Megatron's dropout 0.1 applies, moetune does not change it).",
        "- The last stage: the final norm, the loss's fp32 softmax over the vocabulary shard and the bf16",
        "  logits beside it; DeepSeek-V3's MTP layer (its norms, a MoE layer, its own loss's fp32 softmax,",
        "  computed before the main loss); the first stage: the embedding's dropout mask.",
        "",
        "With the per-family scale this replaces (qwen3 0.84, mixtral 0.96, deepseek 1.0, fitted on these ten",
        "rank-0 runs) the ten rank-0 errors were -1.9 %..+3.8 %. The last stages were not estimated then;",
        "deepseek_v3's would have been -28.7 %: no loss, no MTP layer, and not the input embedding Megatron",
        "builds again on the stage that holds the MTP layer (with the MTP layer's projection of 2h to h: 3.0",
        "GiB of model state; Megatron's report after the step, 17.2 GiB there, now against 16.8). No",
        "residual is left in a factor. Real routing is less even than the padded static routing measured",
        "here; `moetune plan` keeps its 10 % headroom and 3 GiB fixed overhead (CUDA context, NCCL buffers:",
        "neither is in `max allocated`) for that.",
        "",
        *unseen_section(),
        *one_gpu_fits(),
    ]
    return lines, out


def unseen_section() -> list[str]:
    """Estimate vs measured for models the estimate never saw (benchmarks/fit_lease/unseen.py), once
    the device's results are in."""
    results = FIT / "unseen_results.jsonl"
    if not results.exists():
        return []
    rows = fit_rows(FIT / "unseen.json", results)
    return [
        "## Models it never saw",
        "",
        "Kimi-K2 and GPT-OSS-120B, imported from their Hugging Face configs by `moetune new --from-hf` at",
        "their publishers' layouts (`benchmarks/fit_lease/unseen.py` → `unseen.json`), measured the same",
        "way on one H200 (`unseen_results.jsonl`, the last run of each entry; logs in",
        "`benchmarks/fit_lease/logs/unseen/`), after the activation count was written and not tuned on them:",
        "",
        *rows_table(rows),
        "",
        "GPT-OSS-120B ran out of memory on the 140 GiB H200 at both micro batches (its last stage at",
        "micro batch 2 was not run again after a flag error), in TE's unfused softmax: with Megatron's",
        "attention dropout its windowed layers cannot use fused attention (its config's attention dropout",
        "is 0.0, which the importer does not carry). The estimate, which counts that score matrix, puts",
        "each of those ranks above the GPU's memory.",
        "",
    ]


def one_gpu_fits() -> list[str]:
    """Estimate vs measured for the layouts the one-GPU studies fitted (benchmarks/one_gpu_tuning:
    one H100, 2026-11-23), rank 0, each layout once (the first fit of it that measured a peak)."""
    from moetune.experiment.config import TrainingConfig
    from moetune.store import Store
    run = REPO / "benchmarks" / "one_gpu_tuning"
    store = Store(str(run / "moetune.db"))
    rows, seen = [], set()
    for study in store.studies():
        exp = load_experiment(study.model)
        for t in store.trials(study.id):
            path = run / "runs" / str(t.id) / "fit" / "fit.json"
            fitted = json.loads(path.read_text()) if path.exists() else {}
            r0 = (fitted.get("ranks") or {}).get("0") or {}
            cfg = TrainingConfig.from_dict(t.config)
            key = (study.model, cfg.tp, cfg.pp, cfg.ep, cfg.recompute_modules)
            if key in seen or cfg.cuda_graph_impl != "none":  # graphs: the fit predates their capture
                continue
            seen.add(key)
            est = estimate(exp.model, cfg, fitted["world"])
            ours = est.model_state_gb + est.activations_gb
            peak = r0.get("max_allocated_gb")
            if r0.get("failure") == "oom":  # its report before the failure is no peak
                measured, err = f"out of memory (past {peak:.1f} at iteration {r0.get('iterations')})", "-"
            else:
                measured, err = f"{peak:.1f}", f"{(ours - peak) / peak:+.1%}"
            rows.append(f"| {study.model} | {fitted['world']} | {cfg.tp} | {cfg.pp} | {cfg.ep} | {measured} | "
                        f"{ours:.1f} | {err} |")
    return [
        "Checked again on one H100 by the fit stage of the one-GPU studies (2026-11-23,",
        "`benchmarks/one_gpu_tuning/`, section \"One-GPU tuning at production shapes\" of docs/benchmarks.md).",
        "A fit runs 2 micro-batches a pipeline stage, not the production batch (memory does not grow with",
        "the step's micro-batches once the pipeline is full): qwen3_30b_a3b's baseline peaked at 67,152.26 MB",
        "with 2, as the lease's run with 64, in 1.3 s iterations instead of 34 s. Rank 0, GiB:",
        "",
        "| model | GPUs | TP | PP | EP | measured max allocated | estimate | error |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "A layout with CUDA graphs now fits two iterations past Megatron's graph capture (after 3 warm-up",
        "iterations): the graphs' private pools held 26.8 GB on qwen3_235b's EP-128 rank, which a",
        "3-iteration fit never saw. The estimate prices the pools since: a fixed part and a share of the",
        "graphed scopes' saved tensors, measured (docs/benchmarks.md, \"What CUDA graphs take in memory\").",
        "",
        *near_capacity_trials(),
    ]


def near_capacity_trials() -> list[str]:
    """Estimate vs measured for the one-GPU trials of benchmarks/near_capacity.py (one H100): each
    trial's own rank 0 at its step's micro-batches, the variant's estimate as today's code gives it."""
    path = REPO / "benchmarks" / "results" / "near_capacity.json"
    if not path.exists():
        return []
    import tempfile
    import near_capacity
    rows = []
    scratch = Path(tempfile.mkdtemp())
    for v in json.loads(path.read_text())["variants"]:
        c = v["config"]
        if v["micro_batches"] < c["pp"]:  # a step that did not fill the pipeline: not the layout's peak
            continue
        mods = ",".join(c.get("recompute_modules") or []) or "-"
        # replayed graphs allocate nothing: a graphed trial's pools show only in its reserved memory
        graphed = c["cuda_graph_impl"] != "none"
        peak = v["max_reserved_gb" if graphed else "max_allocated_gb"]
        ours = near_capacity.estimate_gb(near_capacity.load_variant(v["variant"], scratch))
        measured, err = ((f"out of memory (past {peak:.1f})", "-") if v["failure"] == "oom"
                         else (f"{peak:.1f}" + (" reserved" if graphed else ""), f"{(ours - peak) / peak:+.1%}"))
        rows.append(f"| {v['variant']} | {c['tp']} | {c['pp']} | {c['ep']} | {c['micro_batch']} | {mods} | "
                    f"{measured} | {ours:.1f} | {err} |")
    return [
        "And by the one-GPU trials of `benchmarks/near_capacity.py` (one H100, 2026-11-23; docs/benchmarks.md,",
        "\"A compute-busy run near capacity\"), rank 0, GiB. core_attn recompute frees nothing under fused",
        "attention (it held 1.2 GB more than the same layout without it); the estimate frees only the softmax",
        "statistics for it. The graphed trial is read by its reserved memory (the graphs' replays allocate",
        "nothing, so their pools show only there):",
        "",
        "| variant | TP | PP | EP | micro batch | recompute | measured max allocated | estimate | error |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def main():
    fit_lines, fit_rows = fit_section()
    rows, argvs, worlds = [], [], []
    for name, label, changes in LAYOUTS:
        e = load_experiment(name)
        cfg = e.baseline.replace(**changes)
        argvs.append(cfg.to_args(e.model) + run_args())
        worlds.append(e.cluster.gpus)
        rows.append((name, label, e, cfg))
    theirs = theoretical_memory(argvs, worlds)
    out, lines = [], [
        "# Memory: the estimate vs the measured peak, and vs Megatron's theoretical figure",
        "",
        *fit_lines,
        "## Estimate vs Megatron's theoretical figure",
        "",
        "Made by `benchmarks/memory_table.py`: moetune's estimate (`moetune/estimate/memory.py`) beside Megatron-Core",
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
    bank = [json.loads(l) for l in (REPO / "data/trial_bank/bank.jsonl").read_text().splitlines() if l]
    proxy = load_experiment("moe_proxy")
    picked = [b for b in bank if b["state"] == "COMPLETED" and b["peak_memory_gb"] and not b.get("study")]
    measured = theoretical_memory([b["args"] for b in picked], [b["gpus"] for b in picked])
    from moetune.experiment.config import TrainingConfig
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
    diffs = [r["scope_total_diff"] for r in out]
    close = sum(abs(d) <= 0.10 for d in diffs)
    low = [d for d in diffs if d < -0.10]
    below = f"{len(low)} rows, {max(low):+.0%} to {min(low):+.0%}" if low else "none"
    table2 = ", ".join(f"{r['model']} {r['scope_total_diff']:+.1%}" for r in out[-2:])
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
        "Weights, gradients and optimizer states use Megatron's accounting and agree on every row but",
        "deepseek_v3's: Megatron prices every first stage as an even share of MoE layers plus the MTP layers,",
        "while deepseek_v3's first stage holds its 3 dense layers only (`--decoder-first-pipeline-num-layers 3`);",
        "measured on that rank (fit lease, above): 8.1 GiB of model state, moetune 8.1, Megatron 20.0. moetune's",
        "rows are its heaviest stage, which for deepseek_v3 is the second (4 MoE layers, 15 micro batches in",
        "flight), not the first Megatron's figure prices. \"Megatron's",
        "scope\" is moetune's own per-layer formula with every layer priced as that dense layer",
        f"(`estimate(..., routing=False)`): like with like, it lands within 10 % of Megatron's total on {close} of",
        f"{len(out)} rows. Below by more ({below}): layouts",
        "with SP but without selective recompute, where Megatron switches to its no-SP formula",
        "`s·b·h·(10 + 24/TP)`, which neither splits the 10·sbh by TP nor looks at `ffn_hidden_size`. With SP and",
        f"selective recompute of core_attn (Megatron's Table 2 case, the last two rows): {table2}. Table 2's",
        "selective recompute keeps Q, K and V as moetune's does (core_attn frees nothing more under fused",
        "attention: measured on an H100, docs/benchmarks.md \"A compute-busy run near capacity\"), but takes",
        "the query's width to be the hidden size: Qwen3-235B's is twice it (64 heads of 128 on 4096).",
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
    (REPO / "benchmarks" / "results" / "memory_fit.json").write_text(json.dumps(fit_rows, indent=1))
    print("\n".join(lines))


def compare(layouts: Path, results: Path) -> None:
    """Print estimate vs measured for a file of fit entries and its device results, nothing written."""
    rows = fit_rows(layouts, results)
    print("\n".join(rows_table(rows)))
    errs = [r["error"] for r in rows if r["error"] is not None]
    print(f"\n{len(errs)} of {len(rows)} entries measured" +
          (f"; the estimate within {min(errs):+.1%}..{max(errs):+.1%}" if errs else ""))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layouts", type=Path, help="fit entries (layouts.json's format); with --results: compare only")
    ap.add_argument("--results", type=Path, help="the device's results for them (results.jsonl's format)")
    a = ap.parse_args()
    if bool(a.layouts) != bool(a.results):
        ap.error("--layouts and --results go together")
    if a.layouts:
        compare(a.layouts, a.results)
    else:
        main()
