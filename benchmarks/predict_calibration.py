"""The step-time model's free rates, calibrated only on what moetune measured itself: the one-GPU
trials and trial-bank runs in benchmarks/trial_bank/bank.jsonl (each with its trace analysis:
kernel time per class, launches a step, GPU busy share), against the model's own FLOPs and bytes
for that rank and the GPU table's data-sheet figures (spec/gpus.py). No public throughput figure
is read here.

    .venv/bin/python benchmarks/predict_calibration.py [--out benchmarks/results/predict_calibration.json]

prints each rate with the trials it came from; rates.py's efficiency rows carry these values
(tests/test_predict_rates.py keeps the two equal)."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from moetune.pipeline.spec import gpus
from moetune.pipeline.spec.config import TrainingConfig
from moetune.pipeline.spec.experiment import load_experiment
from moetune.pipeline.spec.predict import flops
from moetune.pipeline.spec.predict.rates import Rates

BANK = ROOT / "benchmarks" / "trial_bank" / "bank.jsonl"
OUT = ROOT / "benchmarks" / "results" / "predict_calibration.json"
# the bank's one-GPU studies of production models ran on the H100 device machine (16 CPU cores,
# docs/benchmarks.md); the moe_proxy entries on the H200 pair (16 cores a GPU)
STUDIES = {"qwen3_30b_a3b-1gpu": ("qwen3_30b_a3b", "H100"), "qwen3_235b-1gpu": ("qwen3_235b", "H100")}
TE_PAIR = ("te_gg", "te_gg_fp8")  # the same moe_proxy_te run without and with FP8 (blockwise)
GRAPHS_PAIR = ("qwen3_30b_a3b-1gpu_t1_baseline", "qwen3_30b_a3b-1gpu_t2_cuda_graphs_te")
MATRIX = ("gemm", "grouped_gemm")  # TE's grouped GEMM runs cuBLAS GEMMs: classed `gemm`
ATTENTION = ("attention",)
COMM = ("a2a", "nccl_other", "deepep", "hybridep")
HOST_BOUND_BUSY = 0.5  # a trial whose GPU is busy less than half the step is paced by its host
CPUS_PER_RANK = 16  # the device machines' CPU cores per GPU
# no H100 GEMM reaches more than about 0.8 of the data sheet's dense BF16 rate: a trial above it
# ran fewer FLOPs than the model counts for it (the 235B runs at EP 128 hold one expert a rank,
# whose fake-group all-to-all does not deliver the other ranks' tokens), so it prices nothing
GEMM_CEILING = 0.8


def bank() -> dict[str, dict]:
    return {d["name"]: d for d in map(json.loads, BANK.read_text().splitlines())}


def arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def trial_config(entry: dict) -> TrainingConfig:
    """The config as run: the bank's config with the global batch of its argv (the one-GPU runs
    take a step of 4 sequences a data-parallel rank, not the experiment's global batch)."""
    c = TrainingConfig.from_dict(entry["config"])
    return c.replace(global_batch=int(arg(entry["args"], "--global-batch-size") or c.global_batch))


def per_step(entry: dict) -> dict:
    m = entry["analysis"]["metrics"]["combined"]
    steps = m["steps"]
    return {k: v / steps for k, v in m["kernel_class_ms"].items()}, m


def one_gpu_rows(b: dict) -> list[dict]:
    """Each completed, un-graphed one-GPU trial of a production model: the model's FLOPs and bytes
    of rank 0 (stage 0) against the trace's kernel time by class."""
    rows = []
    for name, e in b.items():
        study = next((s for s in STUDIES if name.startswith(s + "_")), None)
        if not study or e["state"] != "COMPLETED" or not e.get("analysis"):
            continue
        exp_name, gpu = STUDIES[study]
        c = trial_config(e)
        model = load_experiment(exp_name).model
        classes, m = per_step(e)
        mb = 4  # a step of 4 sequences a data-parallel rank, micro batch 1
        w = flops.stage_work(model, c, Rates())[0]
        g = gpus.GPUS[gpu]
        matrix = sum(v for k, v in w.flops.items() if k not in flops.ATTENTION) * mb
        attention = sum(v for k, v in w.flops.items() if k in flops.ATTENTION) * mb
        matrix_ms = sum(classes[k] for k in MATRIX)
        attention_ms = sum(classes[k] for k in ATTENTION)
        elementwise_ms = sum(v for k, v in classes.items() if k not in MATRIX + ATTENTION + COMM)
        graphed = c.cuda_graph_impl not in (None, "none")
        comparable = not graphed and matrix / (matrix_ms / 1e3) / (g.bf16_tflops * 1e12) <= GEMM_CEILING
        rows.append({
            "trial": name, "gpu": gpu, "layers": w.layers, "micro_batches": mb, "graphed": graphed,
            "step_ms": m["step_time_ms"], "gpu_busy_share": m["gpu_busy_share"],
            "launches_per_step": m["kernels_per_step"],
            "matrix_tflop": matrix / 1e12, "matrix_ms": matrix_ms,
            "attention_tflop": attention / 1e12, "attention_ms": attention_ms,
            "elementwise_gb": w.bytes * mb / 1e9, "elementwise_ms": elementwise_ms,
            "gemm_efficiency": None if not comparable else matrix / (matrix_ms / 1e3) / (g.bf16_tflops * 1e12),
            "attention_efficiency": None if not comparable else attention / (attention_ms / 1e3) / (g.bf16_tflops * 1e12),
            "hbm_efficiency": None if not comparable else w.bytes * mb / (elementwise_ms / 1e3) / (g.hbm_tb_s * 1e12),
            "kernels_per_layer": None if graphed else m["kernels_per_step"] / mb / w.layers,
            "host_us_per_kernel": (1e3 * m["step_time_ms"] / m["kernels_per_step"]
                                   if m["gpu_busy_share"] < HOST_BOUND_BUSY else None),
        })
    return rows


def calibrate() -> dict:
    b = bank()
    rows = one_gpu_rows(b)
    med = lambda key: round(statistics.median(r[key] for r in rows if r[key] is not None), 4)  # noqa: E731
    used = lambda key: [r["trial"] for r in rows if r[key] is not None]  # noqa: E731
    off, on = (per_step(b[n]) for n in GRAPHS_PAIR)
    bf16, fp8 = (per_step(b[n]) for n in TE_PAIR)
    rates = {k: {"value": med(k), "trials": used(k)} for k in
             ("gemm_efficiency", "attention_efficiency", "hbm_efficiency", "kernels_per_layer", "host_us_per_kernel")}
    rates["host_us_per_kernel"]["cpus_per_rank"] = CPUS_PER_RANK
    rates["cuda_graph_te_launches_removed"] = {
        "value": round(1 - on[1]["kernels_per_step"] / off[1]["kernels_per_step"], 4), "trials": list(GRAPHS_PAIR),
        "scopes": list(b[GRAPHS_PAIR[1]]["config"]["cuda_graph_modules"])}
    rates["fp8_launch_factor"] = {"value": round(fp8[1]["kernels_per_step"] / bf16[1]["kernels_per_step"], 4),
                                  "trials": list(TE_PAIR)}
    rates["fp8_matrix_time_factor"] = {
        "value": round((sum(fp8[0][k] for k in MATRIX) + fp8[0]["fp8_cast"]) / sum(bf16[0][k] for k in MATRIX), 4),
        "trials": list(TE_PAIR), "note": "FP8 GEMMs plus their casts over BF16 GEMMs, moe_proxy_te shapes on H200"}
    return {"source": str(BANK.relative_to(ROOT)), "trials": rows, "rates": rates}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    result = calibrate()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'trial':<40} {'matrix eff':>10} {'attn eff':>8} {'hbm eff':>8} {'kern/layer':>10} {'host us':>8}")
    for r in result["trials"]:
        f = lambda v: "-" if v is None else f"{v:.3f}" if v < 10 else f"{v:.1f}"  # noqa: E731
        print(f"{r['trial']:<40} {f(r['gemm_efficiency']):>10} {f(r['attention_efficiency']):>8} "
              f"{f(r['hbm_efficiency']):>8} {f(r['kernels_per_layer']):>10} {f(r['host_us_per_kernel']):>8}")
    for k, v in result["rates"].items():
        print(f"{k}: {v['value']}  ({len(v['trials'])} trials)")
    print(f"written: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
