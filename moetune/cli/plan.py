"""`moetune plan MODEL [--gpus N --gpu-type T] [--baseline] [--order speed|memory] [--format text|json]`:
memory-feasible layouts, each with its estimate and, where the store holds a measured run of that
layout, the measured peak beside it; ranked by predicted tokens/s/GPU (experiment/predict), pipelines with
virtual stages and the baseline among them, or (--order memory) least model parallelism first."""
from __future__ import annotations

import json
import sys

from moetune.analysis.usage import Parser
from moetune.cli.common import (
    add_gpu_args,
    exit_code,
    experiment_for_gpus,
    positive_int,
    refusal_line,
    refuse_unknown_values,
)
from moetune.cli.predict import INT_FLAGS, SPLIT_FIELDS, add_layout_args, layout_config, split_text
from moetune.estimate import StoreReadings
from moetune.estimate.memory import FIXED_GB, TooFewGPUs, plan_cluster
from moetune.estimate.search import batch_bound, search
from moetune.experiment import constraints, gpus
from moetune.experiment.config import TrainingConfig
from moetune.experiment.schema import ConfigError

# the fields each of predict's layout flags sets (beside INT_FLAGS, each its own field)
FLAG_FIELDS = {"dispatcher": ("dispatcher", "flex_backend"), "ep_overlap": ("overlap_ep_a2a",),
               "delay_wgrad": ("delay_wgrad",), "tp_comm_overlap": ("tp_comm_overlap",),
               "no_p2p_overlap": ("overlap_p2p_comm",),
               "cuda_graphs": ("cuda_graph_impl", "cuda_graph_modules"),
               "precision": ("fp8_format", "fp8_recipe"),
               "recompute": ("recompute_granularity", "recompute_modules", "recompute_num_layers"),
               "fsdp": ("fsdp",), "fsdp_sharding": ("fsdp", "fsdp_sharding"),
               **{k: SPLIT_FIELDS + ("vpp",) for k in SPLIT_FIELDS}}


def fixed_fields(a, asked: TrainingConfig, base: TrainingConfig) -> dict:
    """The fields the layout flags given set, at the values of `asked` (the baseline with them):
    every layout plan lists keeps them. A PP given carries the split it got (layout_config)."""
    names = [k for k in INT_FLAGS if getattr(a, k) is not None]
    for flag, fields in FLAG_FIELDS.items():
        if getattr(a, flag, None) is not None:
            names += fields
    if "pp" in names and asked.pp != base.pp:
        names += SPLIT_FIELDS
    return {k: getattr(asked, k) for k in dict.fromkeys(names)}


def dispatcher_text(c: TrainingConfig) -> str:
    """The dispatcher as plan shows it: alltoall, allgather, or flex's backend."""
    return c.flex_backend if c.dispatcher == "flex" and c.flex_backend else c.dispatcher


def overlap_text(c: TrainingConfig) -> str:
    """The overlaps on: ep (EP all-to-all), +wgrad (delayed), tp (TP comm); '-' for none."""
    on = (["ep+wgrad" if c.delay_wgrad else "ep"] if c.overlap_ep_a2a else []) + (["tp"] if c.tp_comm_overlap else [])
    return ",".join(on) or "-"


def graphs_text(c: TrainingConfig) -> str:
    """CUDA graph scopes, shortly: '-' none, 'full' a whole iteration, else the scopes' initials
    (a attn, r moe_router, p moe_preprocess, m mlp, e moe)."""
    if c.cuda_graph_impl in (None, "none"):
        return "-"
    if c.cuda_graph_impl == "full_iteration":
        return "full"
    short = {"attn": "a", "moe_router": "r", "moe_preprocess": "p", "mlp": "m", "moe": "e"}
    return "".join(short.get(s, "?") for s in c.cuda_graph_modules) or "layer"


def recompute_text(c: TrainingConfig) -> str:
    """The recompute column: full, the selective modules, or '-'."""
    return "full" if c.recompute_granularity == "full" else ",".join(c.recompute_modules) or "-"


def search_counts(space) -> list[str]:
    """What the speed search went through, in two lines: layouts considered, fitting and dropped by
    reason; the fitting layouts' settings priced and not kept, by reason."""
    c = space.counts()
    why = ", ".join(f"{code} {n}" for code, n in c["dropped"].items())
    kept = ", ".join(f"{code} {n}" for code, n in c["settings_dropped"].items())
    return [f"searched {c['considered']} layouts: {c['fit']} fit" + (f"; dropped: {why}" if why else ""),
            f"each fitting layout priced with no overlap or CUDA graphs; {c['settings_priced']} settings "
            f"(dispatcher, EP/TP overlap, CUDA graphs) priced for the {c['fit'] - c['bounded']} that can be "
            f"among the {c['keep']} fastest" + (f", not kept: {kept}" if kept else "")
            + (f"; the other {c['bounded']} are slower than the {c['keep']}th even with every communication "
               "and launch hidden" if c["bounded"] else "")]


def main(argv: list[str], db: str | None = None) -> int:
    return exit_code(lambda a: _main(a, db), argv)


def _main(argv: list[str], db: str | None = None) -> int:
    p = Parser(prog="moetune plan",
               description="List the layouts whose estimated per-GPU memory fits, fastest "
                           "predicted first (--order memory: least model parallelism first, "
                           "fit first: moe-optimization-workflow.md).")
    p.add_argument("model", help="experiment name (experiments/NAME.yaml) or path")
    add_gpu_args(p, "GPU count (default: the experiment's cluster)")
    p.add_argument("--baseline", action="store_true",
                   help="only the experiment's baseline layout, listed whether it fits or not")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--limit", type=positive_int, default=10, metavar="N", help="layouts shown at most (default 10)")
    p.add_argument("--order", choices=("speed", "memory"), default="speed",
                   help="speed: predicted tokens/s/GPU, best first (default); memory: least model parallelism first")
    add_layout_args(p)  # each one given: every layout listed keeps it
    args = p.parse_args(argv)
    try:
        exp = experiment_for_gpus(args.model, args.gpus)
        refuse_unknown_values(exp, exp.baseline)
    except ConfigError as e:
        print(f"moetune plan: {e}", file=sys.stderr)
        return 2
    notes: list[str] = []
    try:
        asked = layout_config(exp.baseline, args, exp.model, notes)
    except ValueError as e:
        print(f"moetune plan: {e}", file=sys.stderr)
        return 2
    fixed = fixed_fields(args, asked, exp.baseline)
    if fixed:
        refused = constraints.check(asked, exp.model, plan_cluster(exp, args.gpus, args.gpu_type)[0])
        if refused:  # the same rule, the same line, as `moetune check`
            print(f"moetune plan: {refusal_line(refused)}", file=sys.stderr)
            return 2
        exp = exp.model_copy(update={"baseline": asked})
    for note in notes:
        print(f"moetune plan: {note}", file=sys.stderr)
    readings = StoreReadings(db)  # --db, else MOETUNE_DB, else .moetune/moetune.db; none is created
    try:
        found = search(exp, readings, args.gpus, args.gpu_type, args.order, args.limit, args.baseline, fixed)
    except TooFewGPUs as e:
        print(f"moetune plan: {exp.name}'s baseline needs {e.needed} GPUs (or a multiple); "
              f"{e.gpus} given", file=sys.stderr)
        return 1
    layouts, base, world, capacity = found.layouts, found.base, found.world, found.capacity_gb
    code = (0 if layouts[0].fits else 1) if args.baseline else (0 if layouts else 1)
    if args.format == "json":
        # the rows shown (--limit) and what the search went through (null where it did not run:
        # --baseline, --order memory)
        print(json.dumps({"experiment": exp.name, "world": world, "gpu_type": args.gpu_type or exp.cluster.gpu_type,
                          "capacity_gb": capacity, "order": args.order,
                          "search": found.space.counts() if found.space is not None else None,
                          "layouts": [{**lay.to_dict(), **({"predicted": found.headline(lay)}
                                                            if found.headline(lay) else {})} for lay in layouts]},
                         indent=1))
        return code
    gpu_type = args.gpu_type or exp.cluster.gpu_type
    # where the capacity comes from: a device reports a little less than its data sheet (an H200's
    # 141 GB reads 139.8 GiB to CUDA), so the figure says which it is
    source = ("cluster.gpu_memory_gb" if exp.cluster.gpu_memory_gb
              else f"{gpu_type} {gpus.memory_source(gpu_type)}")
    if args.baseline:
        lay = layouts[0]
        c = lay.config
        verdict = "fits" if lay.fits else ("refused: " + ", ".join(lay.refused) if lay.refused else "does NOT fit")
        print(f"{exp.name} baseline TP{c.tp} PP{c.pp} EP{c.ep} on {world}x {gpu_type}: estimate "
              f"{lay.estimate_gb:.1f} GB allocated + {FIXED_GB:.0f} GB fixed = {lay.memory_gb:.1f} of "
              f"{capacity:g} GB ({source}): {verdict}")
        return code
    bound = None if layouts else batch_bound(exp, world)
    if bound and any(v.code == "global_batch_not_divisible" for v in found.common_refusal()):
        print(f"moetune plan: no layout of {exp.name} on {world} GPUs can run: {bound}", file=sys.stderr)
        return 2
    if not layouts and found.common_refusal():  # the experiment's own values, not the GPUs, stop every layout
        print(f"moetune plan: no layout of {exp.name} on {world} GPUs can run: " +
              "; ".join(f"{v.code}: {v.message}" for v in found.common_refusal()), file=sys.stderr)
        return 2
    if not layouts:
        print(f"no layout of {exp.name} fits, full recompute included; add GPUs, or consider offloading")
        return code
    order = ("fastest predicted first (tokens/s/GPU, routing assumed balanced)" if args.order == "speed" else
             "least model parallelism first, the baseline first where the search does not hold it")
    print(f"{exp.name} on {world}x {gpu_type} ({capacity:g} GB each, {source}): {len(layouts)} feasible layouts "
          f"shown (--limit {args.limit}), {order}"
          + ("; the band: each rate at the ends of its spread, added in quadrature (docs/prediction.md)"
             if args.order == "speed" else ""))
    if found.space is not None:
        for line in search_counts(found.space):
            print(line)
    rw = max([9] + [len(recompute_text(lay.config)) for lay in layouts])  # the column fits its names
    print(f"{'TP':>3} {'CP':>2} {'PP':>3} {'VPP':>3} {'EP':>4} {'ETP':>3} {'MB':>2} {'dispatcher':<10} "
          f"{'overlap':<10} {'graphs':<6} {'recompute':<{rw}} {'GB/GPU':>7} {'measured':>8} "
          f"{'tok/s/GPU':>9} {'ms/step (band)':>22}  band mostly from")
    for lay in layouts:
        c = lay.config
        seen = (f"{'-':>8}" if lay.measured_gb is None else f"{'oom':>8}" if lay.measured_oom
                else f"{lay.measured_gb:>8.1f}")
        head = found.headline(lay) or {}
        speed = head.get("tokens_per_s_per_gpu")
        step = (f"{head['step_time_ms']:.0f} ({head['step_time_low_ms']:.0f}-{head['step_time_high_ms']:.0f})"
                if "step_time_low_ms" in head else "-")
        rows = ", ".join(head.get("band_rows") or []) or "-"
        note = ((f"  ({split_text(c)})" if split_text(c) else "") + (f"  FSDP {c.fsdp_sharding}" if c.fsdp else "")
                + ("  baseline" if lay is base else ""))
        print(f"{c.tp:>3} {c.cp:>2} {c.pp:>3} {c.vpp or '-':>3} {c.ep:>4} {c.etp or c.tp:>3} {c.micro_batch:>2} "
              f"{dispatcher_text(c):<10} {overlap_text(c):<10} {graphs_text(c):<6} {recompute_text(c):<{rw}} "
              f"{lay.memory_gb:>7.1f} {seen} {speed if speed is not None else '-':>9} {step:>22}  {rows}{note}")
    first = found.headline(layouts[0]) or {}
    if args.order == "speed" and "step_time_low_ms" in first:
        lo, hi = first["step_time_low_ms"], first["step_time_high_ms"]
        inside = sum(lo <= (found.headline(lay) or {}).get("step_time_ms", hi + 1) <= hi for lay in layouts)
        print(f"{inside} of the {len(layouts)} shown lie inside the first's band ({lo:.0f}-{hi:.0f} ms): the model "
              "does not order those; a trial of each does")
    return code
