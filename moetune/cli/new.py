"""`moetune new NAME --from-hf PATH/config.json [--gpus N] [--gpu-type T] [--out FILE] [--force]`:
an experiment YAML for any MoE model whose family moetune models (experiment/hf_import.py): the
model section from the config, a cluster section for the GPUs named, and as baseline the fastest
fitting layout `moetune plan` finds. Nothing is written where the config cannot be modelled whole
or no layout fits.

`moetune new NAME --from-megatron [FILE] [-- ARGS...]`: the experiment of a Megatron command line
(experiment/megatron_import.py): its model, its layout and fixes as the baseline, the flags moetune
does not model as extra_args; the measuring flags dropped, named in a comment. The cluster is the
launcher's world where a torchrun prefix names it, else --gpus. Nothing is written where the
command line cannot be modelled whole or the constraint table refuses its layout."""
from __future__ import annotations

import argparse
import json
import sys
import textwrap
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import yaml

from moetune.analysis.usage import Parser
from moetune.cli.common import exit_code, positive_int, refusal_line
from moetune.estimate import StoreReadings
from moetune.estimate.search import search
from moetune.estimate.space import BRING_UP
from moetune.experiment import constraints, extra_args, megatron_import
from moetune.experiment import gpus as gpu_table
from moetune.experiment import megatron_validate as megatron
from moetune.experiment.config import TrainingConfig
from moetune.experiment.hf_import import model_from_hf, not_carried, read_config
from moetune.experiment.schema import Cluster, ConfigError, Experiment, check_name

# NVIDIA's NeMo image and its Megatron-LM tree, as the shipped experiments name them
IMAGE = "nvcr.io/nvidia/nemo:26.06"
MEGATRON_PATH = "/opt/Megatron-Bridge/3rdparty/Megatron-LM"
# the baseline's training fields before the search picks its layout: those of the shipped experiments
BASE: dict[str, Any] = {"micro_batch": 1, "dispatcher": "alltoall", "distributed_optimizer": True, "grouped_gemm": True,
        "router_dtype": "fp32"}
# one NVLink domain per node on HGX boards; GB200/GB300 NVL72: 4 GPUs a node, 72 a domain
NVL72 = ("GB200", "GB300")


def cluster_for(name: str, gpus: int, gpu_type: str, per_node: int | None) -> Cluster:
    """The cluster section of `gpus` GPUs of `gpu_type`: whole nodes of `per_node` (default 8, 4 on
    NVL72 racks), or part of one; ConfigError where the GPUs are not whole nodes."""
    per_node = per_node or (4 if gpu_type in NVL72 else 8)
    if gpus > per_node and gpus % per_node:
        raise ConfigError(f"--gpus {gpus}: give 1..{per_node} GPUs of one node or a multiple of {per_node} "
                          "(--gpus-per-node)")
    on_node = min(gpus, per_node)
    return Cluster(name=check_name(f"{gpu_type.lower()}-{gpus}", "cluster.name"), nodes=max(gpus // per_node, 1),
                   gpus_per_node=on_node, gpu_type=gpu_type, nvlink_domain=72 if gpu_type in NVL72 else on_node,
                   container_image=IMAGE, megatron_path=MEGATRON_PATH)


def default_global_batch(gpus: int) -> int:
    """Sequences a step of the new experiment: 8 a GPU, at least 256 (the shipped experiments')."""
    return max(256, 8 * gpus)


def _cluster_dump(cluster: Cluster) -> dict:
    keep = ("name", "executor", "nodes", "gpus_per_node", "gpu_type", "nvlink_domain", "time_limit", "template",
            "container_image", "megatron_path")
    return {k: cluster.model_dump()[k] for k in keep}


def _model_dump(model) -> dict:
    """The model's fields the config set (a default left out): the YAML reads like the shipped ones."""
    return {f.name: getattr(model, f.name) for f in fields(model)
            if f.default is MISSING or getattr(model, f.name) != f.default}


def render(name: str, source: Path, exp: Experiment, headline: dict | None, world: int,
           ignored: list[str] | tuple[str, ...] = ()) -> str:
    """The experiment's YAML text, its comments saying where the model and the baseline came from."""
    c, cl = exp.baseline, exp.cluster
    base = {k: v for k, v in c.to_dict().items() if v != TrainingConfig().to_dict()[k]}
    speed = f", {headline['tokens_per_s_per_gpu']} tokens/s/GPU predicted" if headline else ""
    dump = lambda d: yaml.safe_dump(d, sort_keys=False, default_flow_style=False, width=100)  # noqa: E731
    return "".join([
        f"# {name}: imported by `moetune new` from {json.dumps(str(source))}.\n",  # quoted: a path may hold anything
        *(f"# {line}\n" for line in textwrap.wrap(
            "not carried (they change no size moetune prices): " + ", ".join(ignored), 98) if ignored),
        f"name: {name}\n",
        f"description: {exp.description}\n",
        dump({"model": _model_dump(exp.model)}),
        f"# {world}x {cl.gpu_type}; partition, account and image are the site's: edit them\n",
        dump({"cluster": _cluster_dump(cl)}),
        f"# the fastest fitting layout moetune's plan search finds on {world}x {cl.gpu_type}\n"
        f"# (uneven pipeline stages allowed): TP{c.tp} PP{c.pp} EP{c.ep}{speed}\n",
        dump({"baseline": base}),
    ])


def render_imported(name: str, source: str, exp: Experiment, dropped: list[tuple[str, str]]) -> str:
    """The YAML text of an experiment imported from a Megatron command line, its comments naming
    the source and each flag not carried with why."""
    c, cl = exp.baseline, exp.cluster
    base = {k: v for k, v in c.to_dict().items() if v != TrainingConfig().to_dict()[k]}
    dump = lambda d: yaml.safe_dump(d, sort_keys=False, default_flow_style=False, width=100)  # noqa: E731
    flat = lambda text: " ".join(str(text).splitlines())  # noqa: E731  # a newline would end the comment
    return "".join([
        f"# {name}: imported by `moetune new --from-megatron` from {flat(source)}.\n",
        *(["# not carried (moetune's trials set their own, or render it from another field):\n"] if dropped else []),
        *(f"#   {flat(flag)}: {flat(why)}\n" for flag, why in dropped),
        f"name: {name}\n",
        f"description: {exp.description}\n",
        dump({"model": _model_dump(exp.model)}),
        f"# {cl.world}x {cl.gpu_type}; partition, account and image are the site's: edit them\n",
        dump({"cluster": _cluster_dump(cl)}),
        f"# the command line's layout and fixes: TP{c.tp} PP{c.pp} EP{c.ep}\n",
        dump({"baseline": base}),
        *([("# flags moetune does not model: passed through as written, not priced\n"),
           dump({"extra_args": list(exp.extra_args)})] if exp.extra_args else []),
    ])


def from_megatron(args: argparse.Namespace, name: str, out: Path, after: list[str] | None) -> int:
    """`moetune new --from-megatron`: write the experiment of the command line in args.from_megatron
    (a file) or `after` (the words after --); ConfigError (one line) where it cannot be."""
    if args.seq_length or args.global_batch:
        raise ConfigError("--seq-length and --global-batch go with --from-hf; --from-megatron takes the "
                          "command line's --seq-length and --global-batch-size")
    if args.from_megatron and after:
        raise ConfigError(f"--from-megatron {args.from_megatron} and arguments after --: give one command line")
    if args.from_megatron:
        words, source = megatron_import.read_command_file(args.from_megatron), json.dumps(args.from_megatron)
    elif after:
        words, source = after, "the command line after --"
    else:
        raise ConfigError("--from-megatron: give a file of the command line, or its arguments after --")
    where = f"--from-megatron {args.from_megatron}" if args.from_megatron else "the Megatron arguments"
    got = megatron_import.import_argv(words, name, where)
    gpus, per_node = args.gpus, args.gpus_per_node
    if got.world:
        nodes, on_node = got.world
        if (gpus and gpus != nodes * on_node) or (per_node and per_node != on_node):
            raise ConfigError(f"--gpus {gpus}, --gpus-per-node {per_node}: the command line's launcher runs "
                              f"{nodes} node(s) of {on_node}; give those or leave them out")
        gpus, per_node = nodes * on_node, on_node
    gpus = gpus or 8
    cluster = cluster_for(name, gpus, args.gpu_type, per_node)
    baseline = got.baseline
    if not got.batch_given:  # Megatron's own: one micro batch on each data-parallel rank
        baseline = baseline.replace(global_batch=baseline.micro_batch * max(baseline.data_parallel(gpus), 1))
    try:
        kept = extra_args.check(got.extra_args, f"{where}: extra_args")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    refused = constraints.check(baseline, got.model, cluster)
    if refused:
        raise ConfigError(f"{where} on {gpus}x {args.gpu_type}: {refusal_line(refused)}; nothing written")
    unknown = megatron.unknown_flags(kept)
    if unknown:  # a newer Megatron may have them: said, and validated again where a trial uses them
        print(f"moetune new: warning: not in the recorded Megatron's options: {', '.join(unknown)}",
              file=sys.stderr)
    exp = Experiment(name=name, description=f"{name} on {gpus} {args.gpu_type}, from a Megatron command line",
                     model=got.model, cluster=cluster, baseline=baseline, extra_args=kept)
    write(out, render_imported(name, source, exp, got.dropped))
    m, c = got.model, baseline
    print(f"{out}: {name}, {m.num_layers} layers, {m.num_experts} experts top-{m.moe_router_topk}; baseline TP{c.tp} "
          f"PP{c.pp} EP{c.ep} on {gpus}x {args.gpu_type}; {len(kept)} extra_args words, "
          f"{len(got.dropped)} flags dropped")
    return 0


def write(out: Path, text: str) -> None:
    """`text` into `out` (its folder made); ConfigError (one line) where it cannot be written."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    except OSError as e:
        raise ConfigError(f"--out {out}: cannot write it ({e.strerror or e})") from None


def _main(argv: list[str], db: str | None) -> int:
    p = Parser(prog="moetune new", description="Write an experiment YAML for a MoE model from its "
               "Hugging Face config.json, its baseline the fastest fitting layout the plan finds; "
               "or from a Megatron command line (after --, or in FILE), its baseline that "
               "command line's layout.")
    p.add_argument("name", help="the experiment's name (letters, digits, '.', '_', '-')")
    origin = p.add_mutually_exclusive_group(required=True)
    origin.add_argument("--from-hf", metavar="PATH", help="the model's Hugging Face config.json")
    origin.add_argument("--from-megatron", nargs="?", const="", metavar="FILE",
                        help="a Megatron command line: in FILE (one line or `\\` continued, a torchrun "
                             "prefix allowed), else the arguments after --")
    p.add_argument("--gpus", type=positive_int, default=None,
                   help="GPUs of the cluster (default 8; --from-megatron: the torchrun prefix's world)")
    p.add_argument("--gpu-type", choices=gpu_table.GPU_TYPES, default="H100", help="default H100")
    p.add_argument("--gpus-per-node", type=positive_int, default=None, help="default 8 (4 on GB200/GB300)")
    p.add_argument("--seq-length", type=positive_int, default=None,
                   help="--from-hf: tokens per sequence (default 4096)")
    p.add_argument("--global-batch", type=positive_int, default=None,
                   help="--from-hf: sequences per step (default 8 a GPU, at least 256)")
    p.add_argument("--out", default=None, help="the YAML written (default experiments/NAME.yaml)")
    p.add_argument("--force", action="store_true", help="overwrite an existing --out file")
    megatron_argv = argv[argv.index("--") + 1:] if "--" in argv else None
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    name = check_name(args.name, "NAME")
    out = Path(args.out or Path("experiments") / f"{name}.yaml")
    if out.suffix not in (".yaml", ".yml"):
        raise ConfigError(f"--out {out}: an experiment file ends in .yaml or .yml")
    if out.is_dir() or (out.exists() and not args.force):
        raise ConfigError(f"--out {out}: {'a folder' if out.is_dir() else 'exists'}; give another path"
                          + ("" if out.is_dir() else " or --force to overwrite it"))
    if args.from_megatron is not None:
        return from_megatron(args, name, out, megatron_argv)
    if megatron_argv is not None:
        raise ConfigError("arguments after -- are a Megatron command line: give --from-megatron with them")
    gpus = args.gpus or 8
    source = Path(args.from_hf)
    config = read_config(source)
    model = model_from_hf(config, name, args.seq_length or 4096, where=str(source))
    cluster = cluster_for(name, gpus, args.gpu_type, args.gpus_per_node)
    batch = args.global_batch or default_global_batch(gpus)
    exp = Experiment(name=name, description=f"{name} on {gpus} {args.gpu_type}", model=model,
                     cluster=cluster, baseline=TrainingConfig(global_batch=batch, **BASE))
    found = search(exp, StoreReadings(db), limit=1, fixed=BRING_UP)  # a first trial's: none on
    if not found.layouts:
        raise ConfigError(f"no layout of {name} fits on {found.world}x {args.gpu_type} ({found.capacity_gb:g} GB "
                          f"each) at global batch {batch}; give more GPUs (--gpus) or a larger --gpu-type; "
                          "nothing written")
    best = found.layouts[0]
    exp = exp.model_copy(update={"baseline": best.config})
    write(out, render(name, source, exp, found.headline(best), found.world, not_carried(config)))
    c = best.config
    print(f"{out}: {name}, {model.num_layers} layers, {model.num_experts} experts top-{model.moe_router_topk}; "
          f"baseline TP{c.tp} PP{c.pp} EP{c.ep} on {found.world}x {args.gpu_type} ({best.memory_gb:.1f} GB/GPU)")
    return 0


def main(argv: list[str], db: str | None = None) -> int:
    """Run `moetune new`; a config moetune cannot model or a layout that cannot fit: one line, exit 2."""
    def run(a: list[str]) -> int:
        try:
            return _main(a, db)
        except ConfigError as e:
            print(f"moetune new: {e}", file=sys.stderr)
            return 2
    return exit_code(run, argv)
