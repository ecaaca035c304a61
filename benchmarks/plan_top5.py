"""`moetune plan`'s five fastest layouts of each flagship experiment beside NVIDIA's published H100
layout (benchmarks/predict_validation.yaml), with the step-time terms of each, as markdown for
docs/prediction.md. NVIDIA's layout is priced in the experiment's own precision and batch, with
the dispatcher and overlap its recipe sets; its rank is that of its parallel layout (TP, CP, PP,
VPP, EP, ETP, micro batch) in the search, with the settings the search chose for it.

    .venv/bin/python benchmarks/plan_top5.py            # all three flagships
    .venv/bin/python benchmarks/plan_top5.py qwen3_235b
"""
from __future__ import annotations

import argparse

from moetune.cli.plan import dispatcher_text, graphs_text, overlap_text, recompute_text
from moetune.cli.predict import split_text
from moetune.estimate import StoreReadings, price
from moetune.estimate.memory import estimate, fits_plan, plan_cluster
from moetune.estimate.search import search
from moetune.estimate.space import pipeline_split
from moetune.experiment.schema import load_experiment

# NVIDIA's layouts: predict_validation.yaml's rows (Megatron-Bridge recipes), in TrainingConfig fields
NVIDIA = {
    "qwen3_30b_a3b": ("qwen3_30b-ep16-26.06", dict(tp=1, pp=1, vpp=None, ep=16, etp=1, dispatcher="flex",
                                                   flex_backend="hybridep", overlap_ep_a2a=False)),
    "qwen3_235b": ("qwen3_235b-26.04.01", dict(tp=2, pp=8, vpp=4, ep=32, etp=1, dispatcher="alltoall",
                                               overlap_ep_a2a=True, sequence_parallel=True)),
    "deepseek_v3": ("deepseek_v3-25.09", dict(tp=2, pp=8, vpp=4, ep=64, etp=1, dispatcher="flex", flex_backend="deepep",
                                              overlap_ep_a2a=True, sequence_parallel=True,
                                              recompute_granularity="selective",
                                              recompute_modules=("mla_up_proj", "mlp"))),
}
PARALLEL = ("tp", "cp", "pp", "vpp", "ep", "etp", "micro_batch")
TERMS = ("compute", "host_launch", "ep_a2a", "tp_collectives", "pp_sends", "cp_exchange", "pipeline_bubble",
         "dp_grad_reduce", "dp_param_gather", "optimizer")
SHORT = {"compute": "compute", "host_launch": "host", "ep_a2a": "a2a", "tp_collectives": "tp", "pp_sends": "pp",
         "cp_exchange": "cp", "pipeline_bubble": "bubble", "dp_grad_reduce": "dp red", "dp_param_gather": "dp gat",
         "optimizer": "opt"}


def row(label: str, c, memory_gb: float, p) -> str:
    """One markdown row: the layout, its memory, speed and terms (ms a step)."""
    split = f" ({split_text(c)})".replace("|", "\\|") if split_text(c) else ""  # a layout's | in a table
    layout = (f"TP{c.tp} CP{c.cp} PP{c.pp}" + (f" VPP{c.vpp}" if c.vpp else "") + f" EP{c.ep} ETP{c.etp or c.tp} "
              f"MB{c.micro_batch}" + (f" FSDP {c.fsdp_sharding}" if c.fsdp else "") + split)
    terms = " | ".join(f"{p.terms[t]:.0f}" for t in TERMS)
    return (f"| {label} | {layout} | {dispatcher_text(c)} | {overlap_text(c)} | {graphs_text(c)} | "
            f"{recompute_text(c)} | {memory_gb:.1f} | {p.tokens_per_s_per_gpu:.0f} | {p.step_time_ms:.0f} | {terms} |")


def flagship(name: str, readings: StoreReadings) -> list[str]:
    """The section of one flagship experiment."""
    exp = load_experiment(name)
    row_id, fields = NVIDIA[name]
    found = search(exp, readings, limit=5)
    space = found.space
    assert space is not None
    _, world, capacity = plan_cluster(exp)
    m = exp.model
    nv = exp.baseline.replace(**{**fields, **pipeline_split(m, fields["pp"], fields["vpp"])})
    if name == "qwen3_235b":  # the experiment's baseline is NVIDIA's, with its split
        nv = exp.baseline.replace(**fields)
    est = estimate(m, nv, world)
    rank = next((i + 1 for i, f in enumerate(space.fit)
                 if all(getattr(f.config, k) == getattr(nv, k) for k in PARALLEL)), None)
    head = ("| | layout | dispatcher | overlap | graphs | recompute | GB/GPU | tok/s/GPU | ms/step | "
            + " | ".join(SHORT[t] for t in TERMS) + " |")
    lines = [f"### {name} on {world}x {exp.cluster.gpu_type}", "",
             f"`moetune plan {name}`: searched {space.considered} layouts, {len(space.fit)} fit; "
             "dropped: " + ", ".join(f"{k} {v}" for k, v in space.dropped.most_common()) + ". Global batch "
             f"{exp.baseline.global_batch}, {'FP8' if exp.baseline.fp8_format else 'BF16'} (the experiment's); "
             "terms in ms a step.", "", head, "|" + "---|" * (head.count("|") - 1)]
    for i, lay in enumerate(found.layouts):
        lines.append(row(str(i + 1) + (" (baseline)" if lay is found.base else ""), lay.config, lay.memory_gb,
                         price(exp, lay.config, readings)))
    if rank is not None:
        f = space.fit[rank - 1]
        lines.append(row(f"NVIDIA's parallel layout, rank {rank}", f.config, f.memory_gb,
                         price(exp, f.config, readings)))
    fits = fits_plan(est.total_gb, capacity)
    label = f"NVIDIA's ({row_id}){'' if fits else ', does not fit'}"
    lines.append(row(label, nv, est.total_gb, price(exp, nv, readings)))
    lines.append("")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", default=list(NVIDIA))
    args = p.parse_args()
    readings = StoreReadings.empty()
    for name in args.names:
        print("\n".join(flagship(name, readings)))


if __name__ == "__main__":
    main()
