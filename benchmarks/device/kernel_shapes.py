"""The kernel probe's shapes (moetune/workloads/kernel_probe.py): the GEMM passes and attention of
every shipped experiment's baseline and of the layouts `moetune plan` finds for it (micro batch 1
and 2), so that the kernel table holds the shapes the step-time model prices.

    python benchmarks/device/kernel_shapes.py OUT.json"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import checkout  # noqa: E402,F401  (moetune from this checkout)

from moetune.estimate.kernels import probe_shapes  # noqa: E402
from moetune.estimate.memory import padded_vocab, plan  # noqa: E402
from moetune.experiment.schema import load_experiment  # noqa: E402
from moetune.paths import EXPERIMENTS  # noqa: E402

SKIP = ("moe_proxy", "moe_proxy_te")  # the toy: not a shape a user trains


def layouts():
    for path in sorted(EXPERIMENTS.glob("*.yaml")):
        if path.stem in SKIP:
            continue
        exp = load_experiment(path.stem)
        configs = [exp.baseline] + [lay.config for lay in plan(exp, limit=12, virtual=False)]
        for c in configs:
            for mb in sorted({c.micro_batch, 2 * c.micro_batch}):
                cfg = c.replace(micro_batch=mb)
                yield exp.model, cfg, padded_vocab(exp.model, cfg.tp)


def main(argv):
    if len(argv) != 1:
        print("usage: kernel_shapes.py OUT.json", file=sys.stderr)
        return 2
    shapes = probe_shapes(layouts())
    Path(argv[0]).write_text(json.dumps(shapes))
    print(f"{len(shapes['gemm'])} GEMM shapes, {len(shapes['attention'])} attention shapes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
