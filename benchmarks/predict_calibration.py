"""The step-time model's free rates, calibrated only on what moetune measured itself: the one-GPU
trials and trial-bank runs in data/trial_bank/bank.jsonl (each with its trace analysis:
kernel time per class, launches a step, GPU busy share), against the model's own FLOPs and bytes
for that rank and the GPU table's data-sheet figures (experiment/gpus.py). No public throughput figure
is read here.

    .venv/bin/python benchmarks/predict_calibration.py [--out benchmarks/results/predict_calibration.json]

prints each rate with the trials it came from; rates.py's rows carry these values
(tests/estimate/test_rates.py keeps the two equal). Each trial's GEMM time is printed beside what the
kernel table gives for its rank (the table prices GEMMs and attention; nothing here fits them)."""
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
from moetune.estimate import comm, flops, kernels, measured
from moetune.estimate.step import micro_batches
from moetune.estimate.rates import Rates

BANK = ROOT / "data" / "trial_bank" / "bank.jsonl"
# the calibration probe (workloads/link_probe.py) run four times in one call on each device machine whose
# measurements the rates are: the H200 of the kernel table (its GEMMs), the H100 of the trials (HBM, launches)
REFERENCE_RUNS = {"H200": ROOT / "benchmarks" / "calibration_h200", "H100": ROOT / "benchmarks" / "calibration_h100"}
REFERENCE_OF = {"ref_gemm_top": "H200", "ref_gemm_half_gflop": "H200", "ref_hbm_share": "H100", "ref_launch_us": "H100"}
OUT = ROOT / "benchmarks" / "results" / "predict_calibration.json"
SWEEP = ROOT / "benchmarks" / "results" / "comm_2gpu.json"  # the multi-GPU sweep (benchmarks/comm_results.py)
# the 4-GPU sweep (4 H200 of one host, NVLink), its flex runs beside alltoall's at micro batch 4,
# routing balanced and no overlap: every all-to-all exposed, its transfer read from the trace
SWEEP4, SWEEP4_GPU = ROOT / "benchmarks" / "results" / "comm_4gpu.json", "H200"
FLEX_RUNS = {"deepep": "ep4_mbs4_deepep_balanced", "hybridep": "ep4_mbs4_hybridep_balanced"}
# the bank's one-GPU studies of production models ran on the H100 device machine (16 CPU cores,
# docs/benchmarks.md); the moe_proxy entries on the H200 pair (16 cores a GPU)
STUDIES = {"qwen3_30b_a3b-1gpu": ("qwen3_30b_a3b", "H100"), "qwen3_235b-1gpu": ("qwen3_235b", "H100")}
TE_PAIR = ("te_gg", "te_gg_fp8")  # the same moe_proxy_te run without and with FP8 (blockwise)
GRAPHS_PAIR = ("qwen3_30b_a3b-1gpu_t1_baseline", "qwen3_30b_a3b-1gpu_t2_cuda_graphs_te")
# the same layout without and with --moe-permute-fusion (no graphs, BF16; every layer a MoE layer)
PERMUTE_PAIR = ("qwen3_235b-1gpu_t5_manual_gc", "qwen3_235b-1gpu_t6_permute_fusion")
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
        table = flops.table_ms(w, c, kernels.table_for(gpu))
        rows.append({
            "trial": name, "gpu": gpu, "layers": w.layers, "micro_batches": mb, "graphed": graphed,
            "step_ms": m["step_time_ms"], "gpu_busy_share": m["gpu_busy_share"],
            "launches_per_step": m["kernels_per_step"],
            "matrix_tflop": matrix / 1e12, "matrix_ms": matrix_ms,
            "attention_tflop": attention / 1e12, "attention_ms": attention_ms,
            "elementwise_gb": w.bytes * mb / 1e9, "elementwise_ms": elementwise_ms,
            "study": study, "matrix_ms_table": round(mb * (table["gemm"] + table["grouped_gemm"]), 1),
            "matrix_share_of_peak": None if graphed else matrix / (matrix_ms / 1e3) / (g.bf16_tflops * 1e12),
            "attention_share_of_peak": None if graphed else attention / (attention_ms / 1e3) / (g.bf16_tflops * 1e12),
            "hbm_efficiency": None if graphed else w.bytes * mb / (elementwise_ms / 1e3) / (g.hbm_tb_s * 1e12),
            "kernels_per_layer": None if graphed else m["kernels_per_step"] / mb / w.layers,
            "permute_fusion": c.permute_fusion, "moe_layers": w.moe_layers,
            "local_experts": max(1, model.num_experts // max(c.ep, 1)),
            "untraced_step_ms": round(untraced, 1),
            "host_us_per_kernel": (round(1e3 * untraced / m["kernels_per_step"], 2)
                                   if m["gpu_busy_share"] < HOST_BOUND_BUSY else None),
        })
    return rows


def reference(folders: dict[str, Path] = REFERENCE_RUNS) -> dict:
    """The probe's figures on the machines the rates were measured on (rates.REFERENCE): the median
    over its runs of the GEMM sweep's fitted curve on the kernel table's H200, the device-to-device
    copy's share of the HBM rate and a launch's time on the trials' H100, each with every run's value."""
    out = {}
    for key, gpu in REFERENCE_OF.items():
        values = []
        for f in sorted(folders[gpu].glob("run*.json")):
            r = json.loads(f.read_text())
            assert gpu in r["device"], f"{f}: {r['device']}, not the {gpu} that {key} refers to"
            values.append(measured.probe_figures(r, gpu, 0.0)[key.removeprefix("ref_")])
        out[key] = {"value": round(statistics.median(values), 4), "runs": [round(x, 4) for x in values],
                    "gpu": gpu, "source": str(folders[gpu].relative_to(ROOT))}
    return out


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


def permute_fusion_removed(rows: list[dict]) -> float:
    """Launches --moe-permute-fusion removes a MoE layer and micro-batch: PERMUTE_PAIR's difference."""
    off, on = (next(r for r in rows if r["trial"] == n) for n in PERMUTE_PAIR)
    assert off["moe_layers"] == on["moe_layers"] == on["layers"] and not off["permute_fusion"] and on["permute_fusion"]
    return off["kernels_per_layer"] - on["kernels_per_layer"]


def launches(rows: list[dict]) -> dict:
    """kernels_per_layer and kernels_per_local_expert: launches a micro-batch and layer against the
    experts a rank holds (TE's grouped GEMM launches each one's GEMMs), least squares over the
    un-graphed one-GPU trials and the sweep's baseline, each without permute fusion (a fused trial's
    count has the fusion's launches added back)."""
    removed = permute_fusion_removed(rows)
    pts = [(r["trial"], r["local_experts"],
            r["kernels_per_layer"] + (removed * r["moe_layers"] / r["layers"] if r["permute_fusion"] else 0.0))
           for r in rows if r["kernels_per_layer"]]
    pts += sweep_launches()
    xs, ys = [p[1] for p in pts], [p[2] for p in pts]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    trials = [p[0] for p in pts]
    return {"kernels_per_layer": {"value": round(my - slope * mx, 4), "trials": trials},
            "kernels_per_local_expert": {"value": round(slope, 4), "trials": trials,
                                         "points": [[p[1], round(p[2], 2)] for p in pts]}}


def flex_nvlink() -> dict:
    """deepep_nvlink_* and hybridep_nvlink: each FLEX_RUNS run's bytes over NVLink a step, counted as
    the model counts them (one copy a peer rank its token's experts sit on: comm.rank_dedup_share),
    over its trace's all-to-all transfer (the exposed all-to-all less the waiting on other ranks), a
    share of the GPU's NVLink rate. What the dispatcher's own kernels take (layout, permutation) is
    in the transfer, as it is in a step."""
    import comm_results
    rec = json.loads(SWEEP4.read_text())
    exp = load_experiment(rec["experiment"])
    configs = comm_results.sweep_configs(exp)
    out = {}
    for backend, name in FLEX_RUNS.items():
        run = next(r for r in rec["sweep"] if r["name"] == name)
        c = configs[name]
        a = comm.a2a(exp.model, c, SWEEP4_GPU, exp.cluster.nvlink_domain, Rates())
        assert a["share_across"] == 0 and not c.overlap_ep_a2a, name  # all over NVLink, all exposed
        passes = 2 * a["passes"] * exp.model.num_layers * micro_batches(c, rec["gpus"])  # dispatch, combine
        nbytes = a["bytes_sent"] * a["share_in_nvlink"] * passes
        share = nbytes / (run["a2a_transfer_ms"] / 1e3) / (gpus.GPUS[SWEEP4_GPU].nvlink_gb_s * 1e9)
        rows = ("deepep_nvlink_dispatch", "deepep_nvlink_combine") if backend == "deepep" else ("hybridep_nvlink",)
        for row in rows:
            out[row] = {"value": round(share, 4), "trials": [f"{SWEEP4.name}:{name}"],
                        "gb_a_step": round(nbytes / 1e9, 3), "transfer_ms": run["a2a_transfer_ms"]}
    return out


def calibrate() -> dict:
    b = bank()
    rows = one_gpu_rows(b)
    med = lambda key: round(statistics.median(r[key] for r in rows if r[key] is not None), 4)  # noqa: E731
    used = lambda key: [r["trial"] for r in rows if r[key] is not None]  # noqa: E731
    off, on = (per_step(b[n]) for n in GRAPHS_PAIR)
    bf16, fp8 = (per_step(b[n]) for n in TE_PAIR)
    rates = {k: {"value": med(k), "trials": used(k)} for k in
             ("hbm_efficiency", "host_us_per_kernel")}
    rates.update(launches(rows))
    rates["permute_fusion_launches_removed"] = {"value": round(permute_fusion_removed(rows), 4),
                                                "trials": list(PERMUTE_PAIR)}
    host = [r["host_us_per_kernel"] for r in rows if r["host_us_per_kernel"] is not None]
    rates["host_us_per_kernel"]["range"] = [min(host), max(host)]
    rates["cuda_graph_te_launches_removed"] = {
        "value": round(1 - on[1]["kernels_per_step"] / off[1]["kernels_per_step"], 4), "trials": list(GRAPHS_PAIR),
        "scopes": list(b[GRAPHS_PAIR[1]]["config"]["cuda_graph_modules"])}
    rates.update(flex_nvlink())
    rates["fp8_launch_factor"] = {"value": round(fp8[1]["kernels_per_step"] / bf16[1]["kernels_per_step"], 4),
                                  "trials": list(TE_PAIR)}
    return {"source": str(BANK.relative_to(ROOT)), "trials": rows, "rates": rates,
            "reference": {"rates": reference()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    result = calibrate()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'trial':<40} {'GEMM ms':>8} {'table':>7} {'of peak':>7} {'attn eff':>8} {'hbm eff':>8} "
          f"{'kern/layer':>10} {'host us':>8}")
    for r in result["trials"]:
        f = lambda v: "-" if v is None else f"{v:.3f}" if v < 10 else f"{v:.1f}"  # noqa: E731
        print(f"{r['trial']:<40} {r['matrix_ms']:>8.1f} {f(r['matrix_ms_table']):>7} "
              f"{f(r['matrix_share_of_peak']):>7} {f(r['attention_share_of_peak']):>8} "
              f"{f(r['hbm_efficiency']):>8} {f(r['kernels_per_layer']):>10} {f(r['host_us_per_kernel']):>8}")
    for k, v in result["rates"].items():
        print(f"{k}: {v['value']}  ({len(v['trials'])} trials)")
    for k, v in result["reference"]["rates"].items():
        print(f"{k}: {v['value']}  (median of {', '.join(map(str, v['runs']))})")
    print(f"written: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
