"""`moetune new NAME --from-hf PATH/config.json [--gpus N] [--gpu-type T] [--out FILE] [--force]`:
an experiment YAML for any MoE model whose family moetune models (experiment/hf_import.py): the
model section from the config, a cluster section for the GPUs named, and as baseline the fastest
fitting layout `moetune plan` finds. Nothing is written where the config cannot be modelled whole
or no layout fits."""
from __future__ import annotations

import argparse
import json
import sys
import textwrap
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import yaml

from moetune.cli.common import exit_code, positive_int
from moetune.estimate import StoreReadings
from moetune.estimate.search import search
from moetune.experiment import gpus as gpu_table
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


def _main(argv: list[str], db: str | None) -> int:
    p = argparse.ArgumentParser(prog="moetune new", description="Write an experiment YAML for a MoE model from its "
                                "Hugging Face config.json, its baseline the fastest fitting layout the plan finds.")
    p.add_argument("name", help="the experiment's name (letters, digits, '.', '_', '-')")
    p.add_argument("--from-hf", required=True, metavar="PATH", help="the model's Hugging Face config.json")
    p.add_argument("--gpus", type=positive_int, default=8, help="GPUs of the cluster (default 8)")
    p.add_argument("--gpu-type", choices=gpu_table.GPU_TYPES, default="H100", help="default H100")
    p.add_argument("--gpus-per-node", type=positive_int, default=None, help="default 8 (4 on GB200/GB300)")
    p.add_argument("--seq-length", type=positive_int, default=4096, help="tokens per sequence (default 4096)")
    p.add_argument("--global-batch", type=positive_int, default=None,
                   help="sequences per step (default 8 a GPU, at least 256)")
    p.add_argument("--out", default=None, help="the YAML written (default experiments/NAME.yaml)")
    p.add_argument("--force", action="store_true", help="overwrite an existing --out file")
    args = p.parse_args(argv)
    name = check_name(args.name, "NAME")
    out = Path(args.out or Path("experiments") / f"{name}.yaml")
    if out.suffix not in (".yaml", ".yml"):
        raise ConfigError(f"--out {out}: an experiment file ends in .yaml or .yml")
    if out.is_dir() or (out.exists() and not args.force):
        raise ConfigError(f"--out {out}: {'a folder' if out.is_dir() else 'exists'}; give another path"
                          + ("" if out.is_dir() else " or --force to overwrite it"))
    source = Path(args.from_hf)
    config = read_config(source)
    model = model_from_hf(config, name, args.seq_length, where=str(source))
    cluster = cluster_for(name, args.gpus, args.gpu_type, args.gpus_per_node)
    batch = args.global_batch or default_global_batch(args.gpus)
    exp = Experiment(name=name, description=f"{name} on {args.gpus} {args.gpu_type}", model=model,
                     cluster=cluster, baseline=TrainingConfig(global_batch=batch, **BASE))
    found = search(exp, StoreReadings(db), limit=1)
    if not found.layouts:
        raise ConfigError(f"no layout of {name} fits on {found.world}x {args.gpu_type} ({found.capacity_gb:.0f} GB "
                          f"each) at global batch {batch}; give more GPUs (--gpus) or a larger --gpu-type; "
                          "nothing written")
    best = found.layouts[0]
    exp = exp.model_copy(update={"baseline": best.config})
    text = render(name, source, exp, found.headline(best), found.world, not_carried(config))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    except OSError as e:
        raise ConfigError(f"--out {out}: cannot write it ({e.strerror or e})") from None
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
