"""A completed run that is busy on compute with its allocator peak near the GPU's capacity:
recorded on one H100 as one-GPU trials, to test that such a run is not
classified `memory` (tests/benchmarks/test_near_capacity.py).

Each variant is a production experiment's model with a layout and micro batch chosen by
`moetune/estimate/memory.py`'s estimate to peak at 92-97 % of an 80 GB H100 (the `memory_near_capacity`
row of moetune/analysis/walls.py fires at 0.92), or the same layout with core_attn recompute, to measure
what that frees. It runs as a one-GPU study of one trial without the fit
gate (`tuning.fit_first: false`): the fit's headroom for NCCL buffers and uneven routing (7 GB on
an H100) would keep any layout this close to capacity off the GPU, which is the point of the fit,
and not what this run measures.

    python3 benchmarks/near_capacity.py write DIR    # DIR/<variant>.yaml, one per variant, and
                                                     # each one's estimate (on the device:
                                                     # tune.sh start --one-gpu DIR/*.yaml)
    .venv/bin/python benchmarks/near_capacity.py import TUNE_DIR...  # the packed `tune` folders of
                                                     # tune.sh: the variants' logs and traces to
                                                     # tests/data/gpu/near_capacity/, a table to
                                                     # docs/benchmarks.md and results/
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import checkout  # noqa: E402,F401  (moetune from this checkout)

from moetune.estimate import memory  # noqa: E402
from moetune.experiment.config import TrainingConfig  # noqa: E402
from moetune.experiment.schema import experiment_path, load_experiment  # noqa: E402
from tuning import publish, xz_copy  # noqa: E402

# variant -> (experiment, layout and micro batch on top of its baseline)
VARIANTS = {
    "mixtral_8x7b_tp2_mbs2": ("mixtral_8x7b", {"tp": 2, "pp": 1, "ep": 8, "etp": 1,
                                                "sequence_parallel": True, "micro_batch": 2}),
    "mixtral_8x22b_tp2_pp4": ("mixtral_8x22b", {"tp": 2, "pp": 4, "ep": 8, "etp": 1,
                                                 "sequence_parallel": True, "micro_batch": 1}),
    "mixtral_8x7b_pp4_mbs2_attn": ("mixtral_8x7b", {"tp": 1, "pp": 4, "ep": 8, "micro_batch": 2,
                                                     "recompute_granularity": "selective",
                                                     "recompute_modules": ["core_attn"]}),
    # what core_attn recompute frees, measured: the same layouts as two above, with it
    "mixtral_8x7b_tp2_mbs2_attn": ("mixtral_8x7b", {"tp": 2, "pp": 1, "ep": 8, "etp": 1,
                                                     "sequence_parallel": True, "micro_batch": 2,
                                                     "recompute_granularity": "selective",
                                                     "recompute_modules": ["core_attn"]}),
    "mixtral_8x7b_pp4_attn": ("mixtral_8x7b", {"tp": 1, "pp": 4, "ep": 8, "micro_batch": 1,
                                                "recompute_granularity": "selective",
                                                "recompute_modules": ["core_attn"]}),
}
# Not near capacity: checks of a graphed layout (its fit runs past the graphs' capture and reads
# their pools, train_moe.py prints the run's peak at its end, nsys traces each kernel of a graph)
# on qwen3_30b_a3b's kept one-GPU trial (TE graphs), fitted first; the _trial check runs it without
# the fit, for its trace
GRAPHS = {"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ["attn", "moe_router", "moe_preprocess"]}
CHECKS = {"qwen3_30b_a3b_graphs": ("qwen3_30b_a3b", GRAPHS),
          "qwen3_30b_a3b_graphs_trial": ("qwen3_30b_a3b", GRAPHS)}
DATA = REPO / "tests" / "data" / "gpu" / "near_capacity"
KEPT = REPO / "benchmarks" / "near_capacity"  # the device runs, as imported
SECTION = "## A compute-busy run near capacity"


def variant(name: str) -> dict:
    """The variant's experiment as a YAML mapping: the production experiment with the layout,
    one trial, one GPU, no fit gate (a check: fitted first)."""
    base, layout = {**VARIANTS, **CHECKS}[name]
    d = yaml.safe_load(experiment_path(base).read_text())
    d["name"] = name
    d["description"] = f"{d.get('description', base)}: rank 0 near an H100's capacity (benchmarks/near_capacity.py)"
    d["baseline"].update(layout)
    # a one-GPU step fills the pipeline (experiment/fit.py one_gpu_config; the first run of
    # mixtral_8x7b_pp4_mbs2_attn, before that check, held 2 micro-batches in flight, not 4)
    samples = max(4, d["baseline"].get("pp", 1) * d["baseline"].get("micro_batch", 1))
    d["tuning"].update(budget_trials=1, one_gpu=True, one_gpu_samples=samples,
                       fit_first=name == "qwen3_30b_a3b_graphs")
    return d


def load_variant(name: str, folder: Path):
    """The variant written to folder/<name>.yaml and loaded as moetune loads an experiment."""
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(variant(name), sort_keys=False))
    return load_experiment(path)


def estimate_gb(exp) -> float:
    e = memory.estimate(exp.model, exp.baseline, exp.cluster.gpus)
    return round(e.total_gb - e.fixed_gb, 1)  # as Megatron's max allocated reports it


def write(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in [*VARIANTS, *CHECKS]:
        print(f"{out / name}.yaml: estimate {estimate_gb(load_variant(name, out))} GB")


def _found(path: Path) -> Path:
    """The file, or its .xz as benchmarks/near_capacity/ keeps it."""
    return path if path.exists() else path.with_name(path.name + ".xz")


def keep_run(src: Path, dest: Path) -> None:
    """A packed run's store, reports and each trial's small files, logs xz'd, no traces (the one the
    tests read is in tests/data/gpu/near_capacity)."""
    shutil.rmtree(dest, ignore_errors=True)
    for f in src.rglob("*"):
        if (not f.is_file() or ".sqlite" in f.name or "recipes_trace" in str(f) or f.suffix == ".parquet"
                or f.name == "job.sh" or f.suffix == ".html"):  # rendered again from spec.json, the store
            continue
        out = dest / f.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        if f.suffix == ".txt" and f.name.startswith("log"):
            xz_copy(f, out.with_name(out.name + ".xz"))
        else:
            shutil.copyfile(f, out)


def import_runs(srcs: list[Path]) -> dict:
    out = {"variants": [], "checks": []}
    for run, src in enumerate(srcs, 1):
        r = import_run(src)
        out["variants"] += [{"run": run, **v} for v in r["variants"]]
        out["checks"] += [{"run": run, **c} for c in r["checks"]]
    return out


def micro_batches(folder: Path, config: dict, world: int) -> int:
    """Micro-batches a step of the one-GPU trial ran: its rendered global batch over DP × micro batch."""
    argv = json.loads((folder / "spec.json").read_text())["command"]
    gbs = int(argv[argv.index("--global-batch-size") + 1])
    c = TrainingConfig.from_dict(config)
    return gbs // (c.data_parallel(world) * c.micro_batch)


def import_run(src: Path) -> dict:
    """The packed run's trials, read back: each variant's measured peak against its estimate, and
    its wall with the evidence; the near-capacity trial's trace and log and the check's fit logs
    become test data."""
    from moetune.analysis.logs import parse_log
    from moetune.experiment import fit
    from moetune.store import Store

    store = Store(str(src / "moetune.db"))
    rows, checks = [], []
    tmp = Path(tempfile.mkdtemp(prefix="moetune-near-capacity-"))
    for study in store.studies():
        name = study.name.removesuffix("-1gpu")
        exp = load_variant(name, tmp)
        for t in store.trials(study.id):
            folder = src / "runs" / str(t.id)
            if name == "qwen3_30b_a3b_graphs":  # the fit's verdict as today's code gives it from the same log
                measured = parse_log(_found(folder / "fit" / "log_rank_0.txt"))
                v = fit.verdict({0: measured}, json.loads((folder / "fit" / "fit.json").read_text())["capacity_gb"])
                checks.append({"trial": t.number, "fix": t.fix or "baseline", "fits": v.fits,
                               "peak_gb": v.peak_gb, "reason": v.reason, "failure": v.failure,
                               "iterations": measured["iterations"]})
                kind = "graphed" if v.peak_gb else v.failure
                if kind in ("graphed", "python_error") and not (DATA / f"fit_{kind}.log.xz").exists():
                    xz_copy(_found(folder / "fit" / "log_rank_0.txt"), DATA / f"fit_{kind}.log.xz")
                continue
            if not (folder / "analysis.json").exists():
                continue
            a = json.loads((folder / "analysis.json").read_text())
            log = parse_log(_found(folder / "log_rank_0.txt"))
            c = a["metrics"]["combined"]
            rows.append({"variant": name, "config": t.config, "estimate_gb": estimate_gb(exp),
                         "micro_batches": micro_batches(folder, t.config, exp.cluster.gpus),
                         "graph_launches": c.get("cuda_graph_launches"), "warnings": a.get("warnings") or [],
                         "max_allocated_gb": log["max_allocated_gb"], "max_reserved_gb": log["max_reserved_gb"],
                         "gpu_memory_gb": a["gpu_memory_gb"],  # from the trace (none: no trace)
                         "memory_used_share": round(log["max_allocated_gb"] / a["gpu_memory_gb"], 3)
                         if a["gpu_memory_gb"] else None,
                         "gpu_idle_share": c.get("gpu_idle_share"), "sm_util_estimate": c.get("sm_util_estimate"),
                         "step_time_ms": c.get("step_time_ms"), "wall": a["wall"], "failure": log["failure"],
                         "evidence": [e["rule"] + (" (limit)" if e.get("limits") else "")
                                      for e in a["evidence"]], "folder": folder})
    shutil.rmtree(tmp)
    return {"variants": rows, "checks": checks}


def keep_test_data(rows: list[dict]) -> None:
    # compute-walled with the near-capacity row as a limit: the analysis's own verdict
    # (moetune/analysis/walls.py), from a packed run (the kept runs keep no traces)
    busy = [r for r in rows if r["wall"] == "compute" and "memory_near_capacity (limit)" in r["evidence"]
            and (r["folder"] / "trace_0.sqlite.xz").exists()]
    if busy:  # the one the test reads: the busiest near capacity
        best = min(busy, key=lambda r: r["gpu_idle_share"])
        xz_copy(best["folder"] / "trace_0.sqlite.xz", DATA / "trace.sqlite.xz")
        xz_copy(_found(best["folder"] / "log_rank_0.txt"), DATA / "log.txt.xz")
        (DATA / "config.json").write_text(json.dumps({"variant": best["variant"],
                                                      "experiment": VARIANTS[best["variant"]][0], **best["config"]},
                                                     indent=1, sort_keys=True) + "\n")
    for r in rows:
        r.pop("folder")


def table(r: dict) -> str:
    lines = [SECTION, "",
             "One-GPU trials (`benchmarks/near_capacity.py`; rank 0 alone under the fake process group, "
             "static routing, one H100 80GB HBM3, 79.2 GiB as the trace reports it), each a production "
             "model with a layout and micro batch that the estimate puts near the GPU's capacity. "
             "The wall is the analysis of the trial's own trace and log; `memory_near_capacity` fires "
             "at 0.92 of the GPU's memory and stands as a limit, not a wall (moetune/analysis/walls.py).", "",
             "| run | variant | TP | PP | EP | micro batch | micro-batches a step | estimate GB | max allocated GB | "
             "of the GPU | GPU idle | SM busy (est.) | step ms | wall | evidence |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for v in r["variants"]:
        c = v["config"]
        f = lambda x, p=3: "-" if x is None else f"{x:.{p}f}"
        peak = f"{v['max_allocated_gb']}" + (f" ({v['failure']})" if v["failure"] else "")
        lines.append(f"| {v['run']} | {v['variant']} | {c['tp']} | {c['pp']} | {c['ep']} | {c['micro_batch']} | "
                     f"{v['micro_batches']} | {v['estimate_gb']} | {peak} | {f(v['memory_used_share'])} | "
                     f"{f(v['gpu_idle_share'])} | {f(v['sm_util_estimate'])} | {f(v['step_time_ms'], 1)} | "
                     f"{v['wall']} | {', '.join(v['evidence'])} |")
    lines += ["", "The estimate is `moetune/estimate/memory.py`'s when the runs were imported (docs/memory.md "
              "has today's, the graphed trial's with its CUDA graph pools). The first run of "
              "mixtral_8x7b_pp4_mbs2_attn made a step of 4 samples, 2 micro-batches against 4 stages, "
              "so its first stage held 2 in flight, not 4 (such a one-GPU step is refused now: "
              "experiment/fit.py one_gpu_config); with 8 samples it ran out of memory after 78 GB allocated. "
              "The estimate then was 76.3 GB: it had core_attn recompute free Q, K, V and the output, "
              "which the checkpoint (its inputs) and the projection (its input) keep; it frees only "
              "the softmax statistics now (81.1 GB)."]
    by = {v["variant"]: v for v in r["variants"] if not v["failure"]}
    pairs = [(by[a], by[a + "_attn"]) for a in by if a + "_attn" in by]
    if pairs:
        lines += ["", "What core_attn recompute frees under Transformer Engine's fused attention, measured: "
                  + "; ".join(f"{w['variant']} {w['max_allocated_gb']:.1f} GB against {wo['max_allocated_gb']:.1f} "
                              f"without it ({w['max_allocated_gb'] - wo['max_allocated_gb']:+.1f} GB)"
                              for wo, w in pairs)
                  + ". It frees nothing: the checkpoint keeps Q, K and V and the projection keeps the output. "
                  "So a memory fix is built on only when its fit lowered the measured peak "
                  "(moetune/tune/state.py lowered())."]
    if "mixtral_8x7b_pp4_attn" in by:  # its layout without core_attn is the fit lease's baseline
        lines[-1] += (f" mixtral_8x7b_pp4_attn: {by['mixtral_8x7b_pp4_attn']['max_allocated_gb']:.1f} GB, "
                      "against 49.9 GB without it (mixtral_8x7b's baseline in the fit lease, docs/memory.md, H200).")
    for v in r["variants"]:
        if v.get("graph_launches"):
            whole = [w for w in v["warnings"] if "graph" in w.lower()]
            lines += ["", f"{v['variant']} (run {v['run']}): {v['graph_launches']:.0f} CUDA graph launches "
                      "in the profiled window, their kernels traced node by node (`nsys "
                      "--cuda-graph-trace=node`; " + ("warned: " + whole[0] if whole else
                      "no whole-graph warning") + f"), GPU idle {v['gpu_idle_share']:.3f}."]
    if r["checks"]:
        lines += ["", "The graphed check (qwen3_30b_a3b's kept one-GPU trial, TE graphs of attn, router and "
                  "preprocess; fitted first), each fit's verdict as today's code reads its log (the run "
                  "itself stacked each memory fix on the last, the refused ones too, and reported a "
                  "refusal as a missing memory report; both fixed since):", ""]
        lines += [f"- run {c['run']}, trial {c['trial']} ({c['fix']}): {c['iterations']} fit iterations; "
                  f"{c['reason']}" for c in r["checks"]]
        lines += ["", "Run 2 ran today's tuner: the layernorm fit measured 72.3 GB this time (graph pools "
                  "vary by about a GB from run to run), fitted, and ran as the first layout that fits."]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "write":
        write(Path(argv[1]))
        return 0
    if len(argv) >= 2 and argv[0] == "import":
        srcs = [Path(a) for a in argv[1:]]
        for i, src in enumerate(srcs, 1):  # kept beside this script; importing them again is the same
            kept = KEPT / f"run{i}"
            if src.resolve() != kept.resolve():
                keep_run(src, kept)
        r = import_runs(srcs)
        keep_test_data(r["variants"])
        publish("near_capacity.json", r, table(r), SECTION, docs=True)
        return 0
    print(__doc__.split("\n\n")[-1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
