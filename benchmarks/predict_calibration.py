"""The step-time model's free rates, calibrated only on what moetune measured itself: the one-GPU
trials and trial-bank runs in data/trial_bank/bank.jsonl (each with its trace analysis:
kernel time per class, launches a step, GPU busy share), against the model's own FLOPs and bytes
for that rank and the GPU table's data-sheet figures (experiment/gpus.py). No public throughput figure
is read here.

    .venv/bin/python benchmarks/predict_calibration.py [--out benchmarks/results/predict_calibration.json]

prints each rate with the trials it came from; rates.py's efficiency rows carry these values
(tests/estimate/test_rates.py keeps the two equal)."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from moetune.analysis.logs import parse_log, steady_iterations
from moetune.experiment import gpus
from moetune.experiment.config import TrainingConfig
from moetune.experiment.schema import load_experiment
from moetune.estimate import flops, measured
from moetune.estimate.rates import Rates

BANK = ROOT / "data" / "trial_bank" / "bank.jsonl"
# the calibration probe (workloads/link_probe.py) run four times on the H100 device machine, in one call
REFERENCE_RUNS = ROOT / "benchmarks" / "calibration_h100"
OUT = ROOT / "benchmarks" / "results" / "predict_calibration.json"
SWEEP = ROOT / "benchmarks" / "results" / "comm_2gpu.json"  # the multi-GPU sweep (benchmarks/comm_results.py)
# the bank's one-GPU studies of production models ran on the H100 device machine (16 CPU cores,
# docs/benchmarks.md); the moe_proxy entries on the H200 pair (16 cores a GPU)
STUDIES = {"qwen3_30b_a3b-1gpu": ("qwen3_30b_a3b", "H100"), "qwen3_235b-1gpu": ("qwen3_235b", "H100")}
TE_PAIR = ("te_gg", "te_gg_fp8")  # the same moe_proxy_te run without and with FP8 (blockwise)
GRAPHS_PAIR = ("qwen3_30b_a3b-1gpu_t1_baseline", "qwen3_30b_a3b-1gpu_t2_cuda_graphs_te")
MATRIX = ("gemm", "grouped_gemm")  # TE's grouped GEMM runs cuBLAS GEMMs: classed `gemm`
ATTENTION = ("attention",)
COMM = ("a2a", "nccl_other", "deepep", "hybridep")
HOST_BOUND_BUSY = 0.5  # a trial whose GPU is busy less than half the step is paced by its host


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


def untraced_step_ms(entry: dict) -> float:
    """The trial's step time outside nsys's capture: the median of its log's steady iterations
    (warm-up, CUDA-graph capture and the profiled window left out). Inside the capture the CUDA
    API's tracing slows a host-bound step by 12-27 % (these trials' own logs), so a launch's host
    cost is read here, not from the trace's step."""
    return statistics.median(steady_iterations(parse_log(BANK.parent / entry["log"])))


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
        untraced = untraced_step_ms(e)
        mb = 4  # a step of 4 sequences a data-parallel rank, micro batch 1
        w = flops.stage_work(model, c, Rates())[0]
        g = gpus.GPUS[gpu]
        matrix = sum(v for k, v in w.flops.items() if k not in flops.ATTENTION) * mb
        attention = sum(v for k, v in w.flops.items() if k in flops.ATTENTION) * mb
        matrix_ms = sum(classes[k] for k in MATRIX)
        attention_ms = sum(classes[k] for k in ATTENTION)
        elementwise_ms = sum(v for k, v in classes.items() if k not in MATRIX + ATTENTION + COMM)
        graphed = c.cuda_graph_impl not in (None, "none")
        kinds = [k for k, v in w.flops.items() if v and k not in flops.ATTENTION + ("recompute",)]
        # seconds of this rank's GEMMs at efficiency 1 for large ones, as a function of the half size
        unit = lambda half, w=w, kinds=kinds, mb=mb, g=g: mb * flops.matrix_seconds(  # noqa: E731
            w, kinds, g.bf16_tflops * 1e12, 1.0, half)
        rows.append({
            "trial": name, "gpu": gpu, "layers": w.layers, "micro_batches": mb, "graphed": graphed,
            "step_ms": m["step_time_ms"], "gpu_busy_share": m["gpu_busy_share"],
            "launches_per_step": m["kernels_per_step"],
            "matrix_tflop": matrix / 1e12, "matrix_ms": matrix_ms,
            "attention_tflop": attention / 1e12, "attention_ms": attention_ms,
            "elementwise_gb": w.bytes * mb / 1e9, "elementwise_ms": elementwise_ms,
            "study": study, "unit": None if graphed else unit,
            "matrix_share_of_peak": None if graphed else matrix / (matrix_ms / 1e3) / (g.bf16_tflops * 1e12),
            "attention_efficiency": None if graphed else attention / (attention_ms / 1e3) / (g.bf16_tflops * 1e12),
            "hbm_efficiency": None if graphed else w.bytes * mb / (elementwise_ms / 1e3) / (g.hbm_tb_s * 1e12),
            "kernels_per_layer": None if graphed else m["kernels_per_step"] / mb / w.layers,
            "local_experts": max(1, model.num_experts // max(c.ep, 1)),
            "untraced_step_ms": round(untraced, 1),
            "host_us_per_kernel": (round(1e3 * untraced / m["kernels_per_step"], 2)
                                   if m["gpu_busy_share"] < HOST_BOUND_BUSY else None),
        })
    return rows


def gemm_curve(rows: list[dict]) -> tuple[float, float]:
    """(top, half GFLOP) of flops.gemm_efficiency that give each study's median measured GEMM
    time exactly: two studies, two unknowns; the ratio of their times fixes the half size."""
    studies = sorted({r["study"] for r in rows if r["unit"]})
    assert len(studies) == 2, studies
    pick = [next(r for r in rows if r["study"] == s and r["unit"]) for s in studies]
    measured = [statistics.median(r["matrix_ms"] for r in rows if r["study"] == s and r["unit"]) / 1e3
                for s in studies]
    ratio = lambda half: pick[0]["unit"](half) / pick[1]["unit"](half) - measured[0] / measured[1]  # noqa: E731
    lo, hi = 1e-3, 1e4  # GFLOP, bisected in log space
    assert ratio(lo) * ratio(hi) < 0, "no half size fits both studies"
    for _ in range(200):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if ratio(lo) * ratio(mid) > 0 else (lo, mid)
    half = (lo * hi) ** 0.5
    return pick[0]["unit"](half) / measured[0], half


def reference(folder: Path = REFERENCE_RUNS) -> dict:
    """The probe's figures on the machine the rates above were measured on (rates.REFERENCE): the
    median over its runs of the GEMM sweep's fitted curve, the device-to-device copy's share of
    the HBM rate and a launch's time, each with every run's value."""
    runs = [json.loads(f.read_text()) for f in sorted(folder.glob("run*.json"))]
    per_run = {k: [] for k in ("ref_gemm_top", "ref_gemm_half_gflop", "ref_hbm_share", "ref_launch_us")}
    for r in runs:
        assert "H100" in r["device"], f"{r['device']}: not the H100 the rates were measured on"
        figures = measured.probe_figures(r, "H100", 0.0)
        for k in per_run:
            per_run[k].append(figures[k.removeprefix("ref_")])
    return {k: {"value": round(statistics.median(v), 4), "runs": [round(x, 4) for x in v]} for k, v in per_run.items()}


def sweep_launches() -> list[tuple[str, int, float]]:
    """(run, local experts, launches a step per micro-batch and layer) of the multi-GPU sweep's plain
    baseline (benchmarks/comm_results.py's record; no CUDA graphs)."""
    if not SWEEP.is_file():
        return []
    rec = json.loads(SWEEP.read_text())
    exp = load_experiment(rec["experiment"])
    m, c = exp.model, exp.baseline
    mb = c.global_batch // c.micro_batch // c.data_parallel(rec["gpus"])
    return [(f"{SWEEP.name}:{r['name']}", m.num_experts // c.ep, r["kernels_per_step"] / mb / m.num_layers)
            for r in rec["sweep"] if r["name"].endswith("_baseline") and "slow" not in r["name"]]


def launches(rows: list[dict]) -> dict:
    """kernels_per_layer and kernels_per_local_expert: launches a micro-batch and layer against the
    experts a rank holds (TE's grouped GEMM launches each one's GEMMs), least squares over the
    un-graphed one-GPU trials and the sweep's baseline."""
    pts = [(r["trial"], r["local_experts"], r["kernels_per_layer"]) for r in rows if r["kernels_per_layer"]]
    pts += sweep_launches()
    xs, ys = [p[1] for p in pts], [p[2] for p in pts]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    trials = [p[0] for p in pts]
    return {"kernels_per_layer": {"value": round(my - slope * mx, 4), "trials": trials},
            "kernels_per_local_expert": {"value": round(slope, 4), "trials": trials,
                                         "points": [[p[1], round(p[2], 2)] for p in pts]}}


def calibrate() -> dict:
    b = bank()
    rows = one_gpu_rows(b)
    top, half = gemm_curve(rows)
    med = lambda key: round(statistics.median(r[key] for r in rows if r[key] is not None), 4)  # noqa: E731
    used = lambda key: [r["trial"] for r in rows if r[key] is not None]  # noqa: E731
    off, on = (per_step(b[n]) for n in GRAPHS_PAIR)
    bf16, fp8 = (per_step(b[n]) for n in TE_PAIR)
    rates = {k: {"value": med(k), "trials": used(k)} for k in
             ("attention_efficiency", "hbm_efficiency", "host_us_per_kernel")}
    rates.update(launches(rows))
    curve = used("unit")
    rates["gemm_efficiency"] = {"value": round(top, 4), "trials": curve}
    rates["gemm_half_gflop"] = {"value": round(half, 3), "trials": curve}
    for r in rows:
        unit = r.pop("unit")
        r["matrix_ms_fitted"] = None if unit is None else round(1e3 * unit(half) / top, 1)
    host = [r["host_us_per_kernel"] for r in rows if r["host_us_per_kernel"] is not None]
    rates["host_us_per_kernel"]["range"] = [min(host), max(host)]
    rates["cuda_graph_te_launches_removed"] = {
        "value": round(1 - on[1]["kernels_per_step"] / off[1]["kernels_per_step"], 4), "trials": list(GRAPHS_PAIR),
        "scopes": list(b[GRAPHS_PAIR[1]]["config"]["cuda_graph_modules"])}
    rates["fp8_launch_factor"] = {"value": round(fp8[1]["kernels_per_step"] / bf16[1]["kernels_per_step"], 4),
                                  "trials": list(TE_PAIR)}
    rates["fp8_matrix_time_factor"] = {
        "value": round((sum(fp8[0][k] for k in MATRIX) + fp8[0]["fp8_cast"]) / sum(bf16[0][k] for k in MATRIX), 4),
        "trials": list(TE_PAIR), "note": "FP8 GEMMs plus their casts over BF16 GEMMs, moe_proxy_te shapes on H200"}
    return {"source": str(BANK.relative_to(ROOT)), "trials": rows, "rates": rates,
            "reference": {"source": str(REFERENCE_RUNS.relative_to(ROOT)), "rates": reference()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    result = calibrate()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'trial':<40} {'GEMM ms':>8} {'fitted':>7} {'of peak':>7} {'attn eff':>8} {'hbm eff':>8} "
          f"{'kern/layer':>10} {'host us':>8}")
    for r in result["trials"]:
        f = lambda v: "-" if v is None else f"{v:.3f}" if v < 10 else f"{v:.1f}"  # noqa: E731
        print(f"{r['trial']:<40} {r['matrix_ms']:>8.1f} {f(r['matrix_ms_fitted']):>7} "
              f"{f(r['matrix_share_of_peak']):>7} {f(r['attention_efficiency']):>8} "
              f"{f(r['hbm_efficiency']):>8} {f(r['kernels_per_layer']):>10} {f(r['host_us_per_kernel']):>8}")
    for k, v in result["rates"].items():
        print(f"{k}: {v['value']}  ({len(v['trials'])} trials)")
    for k, v in result["reference"]["rates"].items():
        print(f"{k}: {v['value']}  (median of {', '.join(map(str, v['runs']))})")
    print(f"written: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
