"""The kernel probe's shapes (moetune/workloads/kernel_probe.py): the GEMM passes, TE layers and
attention of every shipped experiment's baseline and of the layouts `moetune plan` finds for it
(micro batch 1 and 2), and of the published layouts the model was built beside
(benchmarks/predict_validation.yaml; not the scoring set's), so that the kernel table holds the
shapes the step-time model prices.

    python benchmarks/device/kernel_shapes.py OUT.json [--only layers,attention]

--only: keep those parts (a probe run that adds rows to a shipped table)."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import checkout  # noqa: E402,F401  (moetune from this checkout)
import yaml  # noqa: E402

from moetune.estimate.kernels import probe_shapes  # noqa: E402
from moetune.estimate.memory import padded_vocab, plan  # noqa: E402
from moetune.experiment.schema import load_experiment  # noqa: E402
from moetune.paths import EXPERIMENTS  # noqa: E402

SKIP = ("moe_proxy", "moe_proxy_te")  # the toy: not a shape a user trains
BUILT_ON = Path(__file__).resolve().parent.parent / "predict_validation.yaml"
PARTS = ("gemm", "attention", "layers")
# attention beyond the experiments' 4k tokens (long-context training) and below them (a context-
# parallel rank's share of a sequence): every measured head layout again at these lengths, one
# sequence a micro-batch for the long ones, one to four for the short
LONG_SEQ = (8192, 16384, 32768)
SHORT_SEQ = (1024, 2048)
SHORT_BATCH = (1, 2, 4)


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
    import predict_validation  # the rows' experiments, imported ones included
    data = yaml.safe_load(BUILT_ON.read_text())
    for row in data["rows"]:
        exp = (predict_validation.imported_experiment(row["model"], row["hf_config"], row["gpus"])
               if row.get("hf_config") else load_experiment(row["model"]))
        cfg = exp.baseline.replace(**{**data["common"], **row["settings"], **row["layout"]})
        yield exp.model, cfg, padded_vocab(exp.model, cfg.tp)


def main(argv):
    only = PARTS
    if len(argv) == 3 and argv[1] == "--only":
        only = tuple(argv[2].split(","))
        argv = argv[:1]
    if len(argv) != 1 or not set(only) <= set(PARTS):
        print(f"usage: kernel_shapes.py OUT.json [--only PARTS] (parts: {', '.join(PARTS)})", file=sys.stderr)
        return 2
    shapes = probe_shapes(layouts())
    longer = {(1, seq, *a[2:]) for a in shapes["attention"] for seq in LONG_SEQ if seq > a[1]}
    shorter = {(b, seq, *a[2:]) for a in shapes["attention"] for seq in SHORT_SEQ for b in SHORT_BATCH
               if seq < a[1]}
    shapes["attention"] = [list(a) for a in sorted({tuple(a) for a in shapes["attention"]} | longer | shorter)]
    for part in PARTS:
        if part not in only:
            shapes[part] = []
    Path(argv[0]).write_text(json.dumps(shapes))
    print(", ".join(f"{len(shapes[p])} {p} shapes" for p in PARTS))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
