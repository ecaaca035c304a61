"""`moetune predict MODEL [--gpus N --gpu-type T] [--tp --pp --vpp --ep --etp --cp --micro-batch
--global-batch --first-pp-layers --last-pp-layers --pp-layout --account-for-embedding
--account-for-loss --dispatcher D --ep-overlap --precision P --recompute R --fsdp --fsdp-sharding S]
[--compute fit|analytic]
[--format text|json]`: a layout's predicted step time and tokens/s/GPU with every term it adds up
(experiment/predict). Each flag left out is the experiment's baseline's; a layout the constraint
table refuses is one line naming the rule, exit 2, as `moetune check` names it. Compute comes from a fit or
one-GPU trial of the same layout where the store holds one, else from the analytic model."""
from __future__ import annotations

import argparse
import json
import sys

from moetune.analysis.usage import Parser
from moetune.cli.common import add_gpu_args, exit_code, experiment_for_gpus, refusal_line, refuse_unknown_values
from moetune.estimate import Prediction, StoreReadings, price
from moetune.estimate.memory import PLAN_HEADROOM_SHARE, estimate, fits_plan, plan_cluster
from moetune.estimate.space import pipeline_split
from moetune.experiment import constraints
from moetune.experiment.config import CUDA_GRAPH_MODULES, FSDP_SHARDING, RECOMPUTE_MODULES, TrainingConfig
from moetune.experiment.schema import ConfigError

DISPATCHERS = {"alltoall": {"dispatcher": "alltoall", "flex_backend": None},
               "allgather": {"dispatcher": "allgather", "flex_backend": None},
               "deepep": {"dispatcher": "flex", "flex_backend": "deepep"},
               "hybridep": {"dispatcher": "flex", "flex_backend": "hybridep"}}
PRECISIONS = {"bf16": {"fp8_format": None, "fp8_recipe": None},
              "fp8": {"fp8_format": "e4m3", "fp8_recipe": "tensorwise"}}
INT_FLAGS = {"tp": "tensor parallel", "pp": "pipeline parallel", "vpp": "virtual stages per pipeline rank",
             "ep": "expert parallel", "etp": "expert tensor parallel", "cp": "context parallel",
             "micro_batch": "micro batch size", "global_batch": "global batch size"}


SPLIT_FIELDS = ("first_pp_layers", "last_pp_layers", "pp_layout", "account_for_embedding", "account_for_loss")


def add_layout_args(p: argparse.ArgumentParser) -> None:
    for key, what in INT_FLAGS.items():
        p.add_argument("--" + key.replace("_", "-"), type=int, metavar="N",
                       help=f"{what} (default: the baseline's)" + ("; 1: no virtual stages" if key == "vpp" else ""))
    p.add_argument("--first-pp-layers", type=int, metavar="N", help="uneven pipeline: the first stage's layers")
    p.add_argument("--last-pp-layers", type=int, metavar="N", help="uneven pipeline: the last stage's layers")
    p.add_argument("--pp-layout", metavar="LAYOUT",
                   help="explicit pipeline layout, as --pipeline-model-parallel-layout (e.g. 'Et*3|(tt|)*29m|L')")
    p.add_argument("--account-for-embedding", action="store_true", default=None,
                   help="count the embedding as a layer in the pipeline split")
    p.add_argument("--account-for-loss", action="store_true", default=None,
                   help="count the loss as a layer in the pipeline split")
    p.add_argument("--dispatcher", choices=tuple(DISPATCHERS))
    p.add_argument("--ep-overlap", action="store_true", default=None,
                   help="overlap the expert all-to-all with the other micro-batch's compute")
    p.add_argument("--delay-wgrad", action="store_true", default=None,
                   help="delay the experts' weight gradients (with --ep-overlap)")
    p.add_argument("--tp-comm-overlap", action="store_true", default=None,
                   help="overlap TP communication with GEMMs (TP > 1)")
    p.add_argument("--no-p2p-overlap", action="store_true", default=None,
                   help="the pipeline's sends not overlapped with compute (--no-overlap-p2p-communication; "
                        "Megatron overlaps them under VPP)")
    p.add_argument("--cuda-graphs", metavar="SCOPES|none",
                   help=f"TE CUDA graphs of these scopes, comma-separated: {','.join(CUDA_GRAPH_MODULES)}; none: off")
    p.add_argument("--precision", choices=tuple(PRECISIONS))
    p.add_argument("--fsdp", action="store_true", default=None,
                   help="Megatron FSDP: weights, gradients and optimizer states sharded over data parallel")
    p.add_argument("--fsdp-sharding", choices=FSDP_SHARDING,
                   help="what Megatron FSDP shards (--data-parallel-sharding-strategy; implies --fsdp; "
                        "default optim_grads_params)")
    p.add_argument("--recompute", metavar="MODULES|full|none",
                   help=f"'full', 'none', or selective modules, comma-separated: {','.join(RECOMPUTE_MODULES)}")


def layout_config(base: TrainingConfig, a, model=None, notes: list[str] | None = None) -> TrainingConfig:
    """The baseline with the flags given; ValueError (one line) for a value that cannot be. Split
    flags given replace the baseline's pipeline split whole; a PP or VPP changed without them
    does not inherit an uneven split made for the baseline's: it is recomputed for `model` (the
    split it gets appended to `notes`, one line)."""
    changes: dict = {k: getattr(a, k) for k in INT_FLAGS if getattr(a, k) is not None}
    changes.update({k: getattr(a, k) for k in ("first_pp_layers", "last_pp_layers") if getattr(a, k) is not None})
    for k, v in changes.items():
        if v < 1:
            raise ValueError(f"--{k.replace('_', '-')} {v}: give 1 or more")
    if changes.get("vpp") == 1:
        changes["vpp"] = None  # one virtual stage is none
    given = {k: getattr(a, k) for k in SPLIT_FIELDS if getattr(a, k, None) is not None}
    if given:
        changes.update({k: None if k in ("first_pp_layers", "last_pp_layers", "pp_layout") else False
                        for k in SPLIT_FIELDS}, **given)
        if a.pp_layout and a.vpp is None:
            changes["vpp"] = None  # the layout's stages over PP
    elif model is not None and _has_split(base) and (
            changes.get("pp", base.pp) != base.pp or ("vpp" in changes and changes["vpp"] != base.vpp)):
        pp, vpp = changes.get("pp", base.pp), changes.get("vpp", base.vpp)
        # a layout string where no first/last or accounted split reaches (as plan's search builds it)
        split = pipeline_split(model, pp, vpp)
        if notes is not None:
            notes.append(f"the baseline's pipeline split ({split_text(base)}) is for PP{base.pp}"
                         + (f" VPP{base.vpp}" if base.vpp else "") + f"; recomputed: {split_text(split) or 'even'}"
                         " (--first-pp-layers/--last-pp-layers/--pp-layout/--account-for-* set it)")
        changes.update(split)
    if "tp" in changes and "etp" not in changes and base.etp is None:
        changes["etp"] = None
    if a.dispatcher:
        changes.update(DISPATCHERS[a.dispatcher])
    if a.ep_overlap:
        changes["overlap_ep_a2a"] = True
    if a.delay_wgrad:
        changes["delay_wgrad"] = True
    if a.tp_comm_overlap:
        changes["tp_comm_overlap"] = True
    if a.no_p2p_overlap:
        changes["overlap_p2p_comm"] = False
    if a.cuda_graphs is not None:
        changes.update(graph_fields(a.cuda_graphs))
    if a.precision:
        changes.update(PRECISIONS[a.precision])
    if a.fsdp or a.fsdp_sharding:
        changes.update(fsdp=True, **({"fsdp_sharding": a.fsdp_sharding} if a.fsdp_sharding else {}))
    if a.recompute == "none":
        changes.update(recompute_granularity=None, recompute_modules=(), recompute_num_layers=None)
    elif a.recompute == "full":
        changes.update(recompute_granularity="full", recompute_modules=(), recompute_num_layers=1)
    elif a.recompute:
        mods = tuple(m for m in a.recompute.split(",") if m)
        bad = [m for m in mods if m not in RECOMPUTE_MODULES]
        if bad:
            raise ValueError(f"--recompute {a.recompute}: {', '.join(bad)} unknown; use 'full', 'none' or modules of "
                             f"{', '.join(RECOMPUTE_MODULES)}")
        changes.update(recompute_granularity="selective", recompute_modules=mods)
    if changes.get("pp") == 1 and "vpp" not in changes:
        changes["vpp"] = None  # one stage has no virtual stages
    c = base.replace(**changes)
    if c.tp > 1 and c.ep > 1:
        c = c.replace(sequence_parallel=True)  # Megatron requires it for MoE with TP
    elif "tp" in changes and c.tp == 1:
        c = c.replace(sequence_parallel=False)  # nothing to split the sequence over
    return c


def graph_fields(text: str) -> dict:
    """--cuda-graphs: 'none' turns graphs off, else TE graphs of the scopes named; ValueError (one
    line) for a scope Megatron does not know."""
    if text == "none":
        return {"cuda_graph_impl": "none", "cuda_graph_modules": ()}
    scopes = tuple(s for s in text.split(",") if s)
    bad = [s for s in scopes if s not in CUDA_GRAPH_MODULES]
    if bad or not scopes:
        raise ValueError(f"--cuda-graphs {text}: {', '.join(bad) or 'no scope'} unknown; use 'none' or scopes of "
                         f"{', '.join(CUDA_GRAPH_MODULES)}")
    return {"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": scopes}


def _has_split(c) -> bool:
    return c.first_pp_layers is not None or c.last_pp_layers is not None or bool(
        c.pp_layout or c.account_for_embedding or c.account_for_loss)


def split_text(c) -> str:
    """A pipeline split as words: 'first 3, last 2 layers', 'embedding and loss accounted', a layout."""
    get = c.get if isinstance(c, dict) else lambda k: getattr(c, k)
    if get("pp_layout"):
        return f"layout {get('pp_layout')}"
    ends = [f"{w} {get(k)}" for w, k in (("first", "first_pp_layers"), ("last", "last_pp_layers")) if get(k)]
    if ends:
        return ", ".join(ends) + " layers"
    counted = [w for w, k in (("embedding", "account_for_embedding"), ("loss", "account_for_loss")) if get(k)]
    return " and ".join(counted) + " accounted" if counted else ""


def render_text(name: str, c: TrainingConfig, p: Prediction, extra_args: list[str] | tuple[str, ...] = ()) -> str:
    i = p.inputs
    split = split_text(c)
    layout = (f"TP{c.tp} PP{c.pp}" + (f" VPP{c.vpp}" if c.vpp else "") + (f" ({split})" if split else "")
              + f" EP{c.ep} ETP{c.etp or c.tp} CP{c.cp}, "
              f"micro batch {c.micro_batch}, global batch {c.global_batch}, "
              f"{p.inputs['ep_a2a_per_layer'].get('dispatcher', 'no')} dispatcher, {i['precision']}")
    band = f" ({p.band.low_ms:.0f}-{p.band.high_ms:.0f})" if p.band is not None else ""
    lines = [f"{name} {layout} on {i['world']}x {i['gpu_type']}: {p.step_time_ms:.0f}{band} ms a step, "
             f"{p.tokens_per_s_per_gpu:.0f} tokens/s/GPU (compute: {p.compute_source})",
             f"  {'term':<16} {'ms/step':>10} {'share':>6}"]
    for k, v in p.terms.items():
        lines.append(f"  {k:<16} {v:>10.1f} {v / p.step_time_ms:>6.1%}")
    if p.band is not None:
        lines.append(band_line(p.band))
    lines.append(f"  {i['micro_batches']} micro-batches a step, bubble fraction {i['bubble_fraction']:.3f}; "
                 "routing assumed balanced")
    if i.get("virtual_stage_host_ms_per_micro_batch"):
        lines.append(f"  host: {i['host_launch_ms_per_micro_batch']:.1f} ms a micro-batch on the slowest stage, "
                     f"{i['virtual_stage_host_ms_per_micro_batch']:.1f} of it the schedule's passes through "
                     f"{c.vpp} virtual stages (host_ms_per_virtual_stage_pass)")
    if i.get("fsdp"):
        lines.append(fsdp_line(i["dp_sync"]))
    slowest = max(i["stage_micro_batch_ms"].values())
    if i.get("nic_ms_per_micro_batch", 0) >= slowest > 0:
        lines.append(f"  NIC-bound: a micro-batch's traffic across the NIC ({i['nic_ms_per_micro_batch']:.0f} ms: "
                     "the all-to-all's share across, FSDP's collectives, the pipeline's sends) outlasts its "
                     "other work and sets its pace; the excess is in those terms")
    if "calibration" in i:
        lines.append(f"  rates measured ({i['calibration']}): {', '.join(i['rates_measured']) or 'none'}; "
                     "the rest published (--format json: each rate's source)")
    if "measured_compute" in i:
        lines.append(f"  compute measured: {i['measured_compute']}")
    if extra_args:
        lines.append(f"  note: extra_args not priced: {' '.join(extra_args)} (passed to Megatron as written; "
                     "the prediction is of the model without them)")
    return "\n".join(lines)


def fsdp_line(d: dict) -> str:
    """Megatron FSDP's collectives of the slowest stage in words: each micro-batch's, and what its
    compute leaves exposed (in the dp_* terms)."""
    each = (f"each micro-batch gathers {d['param_bytes'] / 1e9:.1f} GB of weights forward "
            f"({d['forward_gather_ms']:.0f} ms) and backward ({d['backward_gather_ms']:.0f} ms), reduce-scatters "
            f"its gradients ({d['backward_reduce_ms']:.0f} ms)" if d["forward_gather_ms"] else
            f"each micro-batch reduce-scatters its gradients ({d['backward_reduce_ms']:.0f} ms)"
            if d["backward_reduce_ms"] else "the gradients reduced once a step")
    return (f"  Megatron FSDP {d['strategy']} over DP {d['dp']} / EDP {d['edp']} ({d['link']}): {each}; exposed "
            f"{d['exposed_gather_ms_per_micro_batch']:.0f} + {d['exposed_reduce_ms_per_micro_batch']:.0f} ms a "
            "micro-batch (in dp_param_gather, dp_grad_reduce)")


def band_line(b) -> str:
    """The band in words: its ends and the rows that move it most, each with its kind and moves."""
    rows = "; ".join(f"{r.name} ({r.kind}) -{r.down_ms:.0f}/+{r.up_ms:.0f}" for r in b.dominant())
    return (f"  band {b.low_ms:.0f}-{b.high_ms:.0f} ms: each rate at the ends of its spread, added in quadrature"
            + (f"; most from {rows}" if rows else "; no rate moves it"))


def main(argv: list[str], db: str | None = None) -> int:
    return exit_code(lambda a: _main(a, db), argv)


def _fail(line: str) -> int:
    print(f"moetune predict: {line}", file=sys.stderr)
    return 2


def _main(argv: list[str], db: str | None = None) -> int:
    p = Parser(prog="moetune predict", description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="experiment name (experiments/NAME.yaml) or a YAML path")
    add_gpu_args(p, "GPU count (default: the experiment's cluster)")
    add_layout_args(p)
    p.add_argument("--compute", choices=("fit", "analytic"),
                   help="fit: a measured fit or one-GPU trial of the layout (required); analytic: FLOPs and "
                        "bytes; default: a measurement where the store holds one")
    p.add_argument("--format", choices=("text", "json"), default="text")
    a = p.parse_args(argv)
    try:
        exp = experiment_for_gpus(a.model, a.gpus)
        refuse_unknown_values(exp, exp.baseline)
    except ConfigError as e:
        return _fail(str(e))
    notes: list[str] = []
    try:
        config = layout_config(exp.baseline, a, exp.model, notes)
    except ValueError as e:
        return _fail(str(e))
    cluster, world, capacity = plan_cluster(exp, a.gpus, a.gpu_type)
    refused = constraints.check(config, exp.model, cluster)
    if refused:  # the same rule, the same line, as `moetune check`
        return _fail(refusal_line(refused))
    for note in notes:
        print(f"moetune predict: {note}", file=sys.stderr)
    try:
        pred = price(exp, config, StoreReadings(db), a.gpus, a.gpu_type, a.compute, with_band=True)
    except ValueError as e:
        return _fail(str(e))
    memory = estimate(exp.model, config, world)
    fits = fits_plan(memory.total_gb, capacity)
    if a.format == "json":
        unpriced = {"extra_args_not_priced": list(exp.extra_args)} if exp.extra_args else {}
        print(json.dumps({"model": exp.name, "config": config.to_dict(), **pred.to_dict(),
                          "memory": {**memory.to_dict(), "capacity_gb": capacity, "fits": fits}, **unpriced}, indent=1))
    else:
        print(render_text(exp.name, config, pred, exp.extra_args))
        print(memory_line(memory, capacity, fits))
    return 0


def memory_line(e, capacity: float, fits: bool) -> str:
    """The estimate's peak a GPU in words, its parts, and whether it fits with plan's headroom."""
    graphs = f"; CUDA graphs' pools {e.cuda_graphs_gb:.1f}" if e.cuda_graphs_gb else ""
    within = f"within the plan's {PLAN_HEADROOM_SHARE:.0%} headroom"
    verdict = f"fits {within}" if fits else f"does not fit {within} (moetune plan lists layouts that do)"
    return (f"  memory: {e.total_gb:.1f} GB a GPU by the estimate (weights, gradients and optimizer "
            f"{e.model_state_gb:.1f}; activations {e.activations_gb:.1f}{graphs}; fixed {e.fixed_gb:.1f}) of "
            f"{capacity:g} GB: {verdict}")
