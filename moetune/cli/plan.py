"""`moetune plan MODEL [--gpus N --gpu-type T] [--baseline] [--order speed|memory] [--format text|json]`:
memory-feasible layouts, each with its estimate and, where the store holds a measured run of that
layout, the measured peak beside it; ranked by predicted tokens/s/GPU (experiment/predict), pipelines with
virtual stages and the baseline among them, or (--order memory) least model parallelism first."""
from __future__ import annotations

import argparse
import json
import sys

from moetune.cli.common import add_gpu_args, experiment_for_gpus, exit_code
from moetune.cli.predict import StoreReadings, run_prediction
from moetune.experiment.schema import ConfigError, cluster_section
from moetune.experiment.config import TrainingConfig
from moetune.estimate.memory import FIXED_GB, TooFewGPUs, baseline_layout, plan, plan_cluster

# Fields that do not change a layout's memory: how long it runs and what is profiled. Routing's
# capacity fields are left out too, since a fit runs the layout with static routing.
_NOT_LAYOUT = {"train_iters", "profile_step_start", "profile_step_end", "capacity_factor", "pad_to_capacity"}


def _layout_key(config: dict) -> str:
    return json.dumps({k: v for k, v in config.items() if k not in _NOT_LAYOUT}, sort_keys=True)


def measured_peaks(exp, world: int, readings: StoreReadings) -> dict[str, float]:
    """{layout key: highest measured peak (GB, Megatron's max allocated)} of the trials in the store
    of this model at this GPU count."""
    out: dict[str, float] = {}
    for study, t, metrics in readings.trials():
        if study.model not in (exp.name, exp.model.name):
            continue
        gpus = cluster_section((study.experiment or {}).get("cluster") or {}).world
        # a run's peak, else its fit's (the layout measured on one GPU: experiment/fit.py)
        peak = t.peak_memory_gb if t.peak_memory_gb is not None else metrics.get("fit_peak_gb")
        if peak is None or gpus != world:
            continue
        key = _layout_key(TrainingConfig.from_dict(t.config).to_dict())
        out[key] = max(out.get(key, 0.0), float(peak))
    return out


predicted: dict[int, dict] = {}  # id(layout) -> its prediction's headline, for the rows printed


def ranked(exp, layouts, gpus, gpu_type, readings: StoreReadings) -> list:
    """The layouts by predicted tokens/s/GPU, fastest first (compute measured where the store holds
    a fit of the layout); one the model cannot price (its batch does not divide) goes last."""
    predicted.clear()
    for l in layouts:
        try:
            p = run_prediction(exp, l.config, gpus, gpu_type, None, readings)
        except ValueError:
            continue
        predicted[id(l)] = {"tokens_per_s_per_gpu": round(p.tokens_per_s_per_gpu), "step_time_ms": round(p.step_time_ms, 1),
                            "compute_source": p.compute_source}
    return sorted(layouts, key=lambda l: -predicted.get(id(l), {}).get("tokens_per_s_per_gpu", -1))


def main(argv: list[str], db: str | None = None) -> int:
    return exit_code(lambda a: _main(a, db), argv)


def _main(argv: list[str], db: str | None = None) -> int:
    p = argparse.ArgumentParser(prog="moetune plan",
                                description="List the layouts whose estimated per-GPU memory fits, least "
                                            "model parallelism first (fit first: moe-optimization-workflow.md).")
    p.add_argument("model", help="experiment name (experiments/NAME.yaml) or path")
    add_gpu_args(p, "GPU count (default: the experiment's cluster)")
    p.add_argument("--baseline", action="store_true",
                   help="only the experiment's baseline layout, listed whether it fits or not")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--order", choices=("speed", "memory"), default="speed",
                   help="speed: predicted tokens/s/GPU, best first (default); memory: least model parallelism first")
    args = p.parse_args(argv)
    try:
        exp = experiment_for_gpus(args.model, args.gpus)
    except ConfigError as e:
        print(f"moetune plan: {e}", file=sys.stderr)
        return 2
    _, world, capacity = plan_cluster(exp, args.gpus, args.gpu_type)
    readings = StoreReadings(db)  # --db, else MOETUNE_DB, else .moetune/moetune.db; none is created
    peaks = measured_peaks(exp, world, readings)
    measured = lambda cfg: peaks.get(_layout_key(cfg.to_dict()))  # noqa: E731
    try:
        base = baseline_layout(exp, args.gpus, args.gpu_type, measured=measured)
    except TooFewGPUs as e:
        if args.baseline:
            print(f"moetune plan: {exp.name}'s baseline needs {e.needed} GPUs (or a multiple); "
                  f"{world} given", file=sys.stderr)
            return 1
        base = None
    if args.baseline:
        layouts = [base]
    else:
        speed = args.order == "speed"
        layouts = plan(exp, args.gpus, args.gpu_type, limit=10**6 if speed else args.limit, measured=measured,
                       virtual=speed)
        # the baseline is a candidate too, where it fits and the search's grid does not hold it
        if base is not None and base.fits and all(_layout_key(l.config.to_dict()) != _layout_key(
                base.config.to_dict()) for l in layouts):
            layouts.insert(0, base)
        if speed:
            layouts = ranked(exp, layouts, args.gpus, args.gpu_type, readings)[:args.limit]
    code = (0 if layouts[0].fits else 1) if args.baseline else (0 if layouts else 1)
    if args.format == "json":
        print(json.dumps([{**l.to_dict(), **({"predicted": predicted[id(l)]} if id(l) in predicted else {})}
                          for l in layouts], indent=1))
        return code
    gpu_type = args.gpu_type or exp.cluster.gpu_type
    # where the capacity comes from: a device reports a little less than its data sheet (an H200's
    # 141 GB reads 139.8 in a trace), so the figure says which it is
    source = "cluster.gpu_memory_gb" if exp.cluster.gpu_memory_gb else f"{gpu_type} data sheet"
    if args.baseline:
        l = layouts[0]
        c = l.config
        verdict = "fits" if l.fits else ("refused: " + ", ".join(l.refused) if l.refused else "does NOT fit")
        print(f"{exp.name} baseline TP{c.tp} PP{c.pp} EP{c.ep} on {world}x {gpu_type}: estimate "
              f"{l.estimate_gb:.1f} GB allocated + {FIXED_GB:.0f} GB fixed = {l.memory_gb:.1f} of "
              f"{capacity:.0f} GB ({source}): {verdict}")
        return code
    if not layouts:
        print(f"no layout of {exp.name} fits; add GPUs, or consider offloading and full recompute")
        return code
    order = ("fastest predicted first (tokens/s/GPU, routing assumed balanced)" if args.order == "speed" else
             "least model parallelism first, the baseline first where the search does not hold it")
    print(f"{exp.name} on {world}x {gpu_type} ({capacity:.0f} GB each, {source}): {len(layouts)} feasible layouts "
          f"shown (--limit {args.limit}), {order}")
    rw = max([18] + [len(",".join(l.config.recompute_modules)) for l in layouts])  # the column fits its names
    print(f"{'TP':>3} {'PP':>3} {'VPP':>3} {'EP':>4} {'recompute':<{rw}} {'GB/GPU':>7} {'measured':>8} {'tok/s/GPU':>9}")
    for l in layouts:
        c = l.config
        seen = f"{l.measured_gb:>8.1f}" if l.measured_gb is not None else f"{'-':>8}"
        speed = predicted.get(id(l), {}).get("tokens_per_s_per_gpu")
        note = "  baseline" if l is base else ""
        print(f"{c.tp:>3} {c.pp:>3} {c.vpp or '-':>3} {c.ep:>4} {','.join(c.recompute_modules) or '-':<{rw}} "
              f"{l.memory_gb:>7.1f} {seen} {speed if speed is not None else '-':>9}{note}")
    return code
