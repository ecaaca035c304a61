"""`moetune check [--gpus N --gpu-type T] [--experiment NAME] -- <Megatron arguments>`."""
from __future__ import annotations

import sys

from moetune.analysis.usage import Parser
from moetune.cli.common import add_gpu_args, exit_code
from moetune.experiment import megatron_validate as megatron
from moetune.experiment.config import TrainingConfig
from moetune.experiment.constraints import MEGATRON, Violation, check
from moetune.experiment.model import ModelArch
from moetune.experiment.schema import Cluster, ConfigError, load_experiment

# what Megatron assumes where a flag is absent, and moetune's baseline differs (experiment/config.py)
MEGATRON_DEFAULTS = {"--moe-token-dispatcher-type": "allgather"}


def with_megatron_defaults(argv: list[str]) -> list[str]:
    """argv with Megatron's own default for each flag it leaves out, so check judges what Megatron runs."""
    given = {a.split("=", 1)[0] for a in argv}
    return argv + [x for flag, value in MEGATRON_DEFAULTS.items() if flag not in given for x in (flag, value)]


def both_vpp_forms(argv: list[str]) -> list[Violation]:
    """Megatron takes the virtual stages from one flag only; a config keeps VPP equal to the
    layout's, so both given is seen here, in the argv."""
    given = [f for f in ("--num-virtual-stages-per-pipeline-rank", "--pipeline-model-parallel-layout")
             if f in {a.split("=", 1)[0] for a in argv}]
    if len(given) < 2:
        return []
    return [Violation("pipeline_split_conflict", f"{' and '.join(given)} cannot be set together; the layout "
                      "names the virtual stages", MEGATRON)]


def main(argv: list[str]) -> int:
    return exit_code(_main, argv)


def _main(argv: list[str]) -> int:
    p = Parser(prog="moetune check",
               description="Check a Megatron command line against the combinations "
                           "Megatron and the MoE guidance forbid. Prints ok, or one "
                           "line per violation (exit 1). An argument Megatron does "
                           "not have is a violation; where .venv-megatron exists, "
                           "Megatron's own parser reads the arguments too.")
    add_gpu_args(p, "world size (default: the experiment's, else 8)")
    p.add_argument("--experiment", help="take the model and cluster from experiments/NAME.yaml")
    p.add_argument("--no-te", action="store_true", help="the image has no Transformer Engine")
    p.add_argument("--deep-ep", action="store_true", help="the image has deep_ep")
    p.add_argument("--no-megatron-parser", action="store_true",
                   help="skip Megatron's own parser even where .venv-megatron exists (it takes ~10 s)")
    if "--" in argv:
        i = argv.index("--")
        args, argv = p.parse_args(argv[:i]), argv[i + 1:]
    else:  # no separator: moetune's own options where they are given, the rest is Megatron's
        args, argv = p.parse_known_args(argv)
    if not argv:
        p.error("give the Megatron arguments after --")
    if args.gpus is not None and args.gpus < 1:
        print(f"moetune check: --gpus {args.gpus}: give 1 GPU or more", file=sys.stderr)
        return 2
    try:
        exp = load_experiment(args.experiment) if args.experiment else None
    except ConfigError as e:
        print(f"moetune check: {e}", file=sys.stderr)
        return 2
    # without an experiment, the schema's cluster (one node of 8 H100s, DeepEP not assumed)
    fields = (exp.cluster if exp else Cluster()).model_dump()
    if args.gpus is not None:
        fields.update(nodes=1, gpus_per_node=args.gpus)
    if args.gpu_type:
        fields["gpu_type"] = args.gpu_type
    if args.no_te:
        fields["has_transformer_engine"] = False
    if args.deep_ep:
        fields["has_deep_ep"] = True
    cluster = Cluster.model_validate(fields)
    # a mistyped flag would be read as absent and its default blamed: name it, and judge nothing
    # else of an argv that is not the one meant
    problems = [f"not a Megatron argument: {flag}" for flag in megatron.unknown_flags(argv)]
    if not args.no_megatron_parser and megatron.available():
        refusal = megatron.parser_refusal(argv)
        if refusal:
            problems.append(f"Megatron's parser refuses it: {refusal}")
    if not problems:
        try:
            model = exp.model if exp else ModelArch.from_args(argv)
            config = TrainingConfig.from_args(with_megatron_defaults(argv))
        except (TypeError, ValueError) as e:
            print(f"moetune check: cannot read the arguments: {e}", file=sys.stderr)
            return 2
        problems = [str(v) for v in both_vpp_forms(argv) + check(config, model, cluster)]
    if not problems:
        print("ok")
        return 0
    for line in problems:
        print(line)
    return 1

