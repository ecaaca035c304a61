"""`moetune predict MODEL [--gpus N --gpu-type T] [--tp --pp --vpp --ep --etp --cp --micro-batch
--global-batch --dispatcher D --ep-overlap --precision P --recompute R] [--compute fit|analytic]
[--format text|json]`: a layout's predicted step time and tokens/s/GPU with every term it adds up
(experiment/predict). Each flag left out is the experiment's baseline's. Compute comes from a fit or
one-GPU trial of the same layout where the store holds one, else from the analytic model."""
from __future__ import annotations

import argparse
import json
import sys

from moetune.cli.common import add_gpu_args, experiment_for_gpus, exit_code
from moetune.experiment import fit
from moetune.experiment.config import RECOMPUTE_MODULES, TrainingConfig
from moetune.experiment.schema import ConfigError
from moetune.estimate.memory import min_gpus, plan_cluster
from moetune.estimate import Node, Prediction, predict
from moetune.estimate.measured import rates_for
from moetune.store import NoStore, Store

# the fields a rank's compute and host time depend on: a measurement of a layout stands for
# another that differs elsewhere only (its batch, dispatcher, overlaps, optimizer)
COMPUTE_KEYS = ("tp", "pp", "vpp", "first_pp_layers", "last_pp_layers", "cp", "ep", "etp", "sequence_parallel",
                "micro_batch", "seq_length", "recompute_granularity", "recompute_modules", "recompute_num_layers",
                "fp8_format", "fp8_recipe", "cuda_graph_impl", "cuda_graph_modules", "grouped_gemm",
                "permute_fusion", "transformer_impl", "offload_modules")
DISPATCHERS = {"alltoall": {"dispatcher": "alltoall", "flex_backend": None},
               "deepep": {"dispatcher": "flex", "flex_backend": "deepep"},
               "hybridep": {"dispatcher": "flex", "flex_backend": "hybridep"}}
PRECISIONS = {"bf16": {"fp8_format": None, "fp8_recipe": None},
              "fp8": {"fp8_format": "e4m3", "fp8_recipe": "tensorwise"}}
INT_FLAGS = {"tp": "tensor parallel", "pp": "pipeline parallel", "vpp": "virtual stages per pipeline rank",
             "ep": "expert parallel", "etp": "expert tensor parallel", "cp": "context parallel",
             "micro_batch": "micro batch size", "global_batch": "global batch size"}


def _compute_key(c: TrainingConfig) -> tuple:
    d = c.to_dict()
    return tuple(json.dumps(d[k], sort_keys=True) for k in COMPUTE_KEYS)


class StoreReadings:
    """What predictions read from the store (`db`, else MOETUNE_DB, else .moetune/moetune.db; none
    is created), opened once for a command however many layouts it prices: every trial with its
    metrics (read once: plan's measured peaks read them too), each measured layout's compute, and
    the latest calibration of each cluster."""

    def __init__(self, db: str | None = None):
        try:
            self.store = Store(db, read_only=True)
        except NoStore:
            self.store = None
        self._trials: list[tuple] | None = None
        self._compute: list[tuple] | None = None
        self._calibrations: dict = {}

    def trials(self) -> list[tuple]:
        """(study, trial, its metrics) of every trial in the store, read on first use."""
        if self._trials is None:
            self._trials = [(study, t, self.store.metrics(t.id))
                            for study in (self.store.studies() if self.store else ())
                            for t in self.store.trials(study.id)]
        return self._trials

    def _measurements(self) -> list[tuple]:
        """(model, GPU type, compute key, ms of one micro-batch, where from) of every fit and one-GPU
        trial in the store, read on first use."""
        if self._compute is None:
            self._compute = []
            for study, t, m in self.trials():
                experiment = study.experiment or {}
                samples = (experiment.get("tuning") or {}).get("one_gpu_samples")
                one_gpu = (experiment.get("tuning") or {}).get("one_gpu")
                cfg = TrainingConfig.from_dict(t.config)
                found = []
                if m.get("fit_compute_ms"):
                    found.append((m["fit_compute_ms"] / fit.fit_micro_batches(cfg),
                                  f"fit of trial {t.id} ({study.name}): {m['fit_compute_ms']:.0f} ms a step of "
                                  f"{fit.fit_micro_batches(cfg)} micro-batches"))
                if one_gpu and samples and m.get("judged_step_time_ms") and t.state == "completed":
                    n = samples // cfg.micro_batch
                    found.append((m["judged_step_time_ms"] / n, f"one-GPU trial {t.id} ({study.name}): "
                                  f"{m['judged_step_time_ms']:.0f} ms a step of {n} micro-batches"))
                gpu_type = (experiment.get("cluster") or {}).get("gpu_type")
                self._compute += [(study.model, gpu_type, _compute_key(cfg), ms, src) for ms, src in found]
        return self._compute

    def measured_compute(self, exp, config: TrainingConfig, gpu_type: str) -> tuple[float, str] | None:
        """(ms of one micro-batch on the layout's slowest measured rank, where from): a fit's step of
        its fit_micro_batches, or a one-GPU trial's judged step of its samples, of this model on this
        GPU type; the fastest such record wins."""
        want = _compute_key(config)
        found = [(ms, src) for model, gpu, key, ms, src in self._measurements()
                 if model in (exp.name, exp.model.name) and gpu == gpu_type and key == want]
        return min(found) if found else None

    def rates(self, cluster, model, config: TrainingConfig):
        """The rate table with the latest calibration of the cluster over the published rows
        (`moetune calibrate`), and which calibration; the published rows alone without one."""
        if cluster.name not in self._calibrations:
            self._calibrations[cluster.name] = self.store.latest_calibration(cluster.name) if self.store else None
        return rates_for(self._calibrations[cluster.name], cluster, model, config)


def add_layout_args(p: argparse.ArgumentParser) -> None:
    for key, what in INT_FLAGS.items():
        p.add_argument("--" + key.replace("_", "-"), type=int, metavar="N", help=f"{what} (default: the baseline's)")
    p.add_argument("--dispatcher", choices=tuple(DISPATCHERS))
    p.add_argument("--ep-overlap", action="store_true", default=None,
                   help="overlap the expert all-to-all with the other micro-batch's compute")
    p.add_argument("--precision", choices=tuple(PRECISIONS))
    p.add_argument("--recompute", metavar="MODULES|full",
                   help=f"'full', or selective modules, comma-separated: {','.join(RECOMPUTE_MODULES)}")


def layout_config(base: TrainingConfig, a) -> TrainingConfig:
    """The baseline with the flags given; ValueError (one line) for a value that cannot be."""
    changes = {k: getattr(a, k) for k in INT_FLAGS if getattr(a, k) is not None}
    for k, v in changes.items():
        if v < 1:
            raise ValueError(f"--{k.replace('_', '-')} {v}: give 1 or more")
    if "tp" in changes and "etp" not in changes and base.etp is None:
        changes["etp"] = None
    if a.dispatcher:
        changes.update(DISPATCHERS[a.dispatcher])
    if a.ep_overlap:
        changes["overlap_ep_a2a"] = True
    if a.precision:
        changes.update(PRECISIONS[a.precision])
    if a.recompute == "full":
        changes.update(recompute_granularity="full", recompute_modules=(), recompute_num_layers=1)
    elif a.recompute:
        mods = tuple(m for m in a.recompute.split(",") if m)
        bad = [m for m in mods if m not in RECOMPUTE_MODULES]
        if bad:
            raise ValueError(f"--recompute {a.recompute}: {', '.join(bad)} unknown; use 'full' or modules of "
                             f"{', '.join(RECOMPUTE_MODULES)}")
        changes.update(recompute_granularity="selective", recompute_modules=mods)
    c = base.replace(**changes)
    if c.vpp and c.pp < 2:
        raise ValueError(f"--vpp {c.vpp} needs --pp 2 or more (PP {c.pp})")
    if c.tp > 1 and c.ep > 1:
        c = c.replace(sequence_parallel=True)  # Megatron requires it for MoE with TP
    return c


def run_prediction(exp, config: TrainingConfig, gpus: int | None, gpu_type: str | None, compute: str | None,
                   readings: StoreReadings) -> Prediction:
    """The prediction of `config` on the experiment's cluster (with --gpus/--gpu-type applied).
    compute: "fit" (a measurement required), "analytic", or None (a measurement where there is one)."""
    cluster, world, _ = plan_cluster(exp, gpus, gpu_type)
    if world % min_gpus(config):
        raise ValueError(f"TP{config.tp} PP{config.pp} EP{config.ep} ETP{config.etp or config.tp} CP{config.cp} "
                         f"needs a multiple of {min_gpus(config)} GPUs; {world} given")
    dp = config.data_parallel(world)
    if config.global_batch % (config.micro_batch * dp):
        raise ValueError(f"global batch {config.global_batch} is not a multiple of micro batch {config.micro_batch} "
                         f"x data parallel {dp}")
    measured = None if compute == "analytic" else readings.measured_compute(exp, config, cluster.gpu_type)
    if compute == "fit" and measured is None:
        raise ValueError(f"--compute fit: the store holds no fit or one-GPU trial of this layout of {exp.name} "
                         f"on {cluster.gpu_type}; run `moetune fit` or use --compute analytic")
    rates, calibration = readings.rates(cluster, exp.model, config)
    p = predict(exp.model, config, Node.of(cluster), world, rates=rates, measured_ms=measured[0] if measured else None)
    if calibration:
        p.inputs["calibration"] = calibration
        p.inputs["rates_measured"] = sorted(n for n, r in rates.rows.items() if r.source.startswith("measured:"))
    if measured:
        p.inputs["measured_compute"] = measured[1]
    return p


def render_text(name: str, c: TrainingConfig, p: Prediction) -> str:
    i = p.inputs
    layout = (f"TP{c.tp} PP{c.pp}" + (f" VPP{c.vpp}" if c.vpp else "") + f" EP{c.ep} ETP{c.etp or c.tp} CP{c.cp}, "
              f"micro batch {c.micro_batch}, global batch {c.global_batch}, "
              f"{p.inputs['ep_a2a_per_layer'].get('dispatcher', 'no')} "
              f"dispatcher, {i['precision']}")
    lines = [f"{name} {layout} on {i['world']}x {i['gpu_type']}: {p.step_time_ms:.0f} ms a step, "
             f"{p.tokens_per_s_per_gpu:.0f} tokens/s/GPU (compute: {p.compute_source})",
             f"  {'term':<16} {'ms/step':>10} {'share':>6}"]
    for k, v in p.terms.items():
        lines.append(f"  {k:<16} {v:>10.1f} {v / p.step_time_ms:>6.1%}")
    lines.append(f"  {i['micro_batches']} micro-batches a step, bubble fraction {i['bubble_fraction']:.3f}; "
                 "routing assumed balanced")
    if "calibration" in i:
        lines.append(f"  rates measured ({i['calibration']}): {', '.join(i['rates_measured']) or 'none'}; "
                     "the rest published (--format json: each rate's source)")
    if "measured_compute" in i:
        lines.append(f"  compute measured: {i['measured_compute']}")
    return "\n".join(lines)


def main(argv: list[str], db: str | None = None) -> int:
    return exit_code(lambda a: _main(a, db), argv)


def _fail(line: str) -> int:
    print(f"moetune predict: {line}", file=sys.stderr)
    return 2


def _main(argv: list[str], db: str | None = None) -> int:
    p = argparse.ArgumentParser(prog="moetune predict", description=__doc__.split("\n\n")[0])
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
    except ConfigError as e:
        return _fail(str(e))
    try:
        config = layout_config(exp.baseline, a)
        pred = run_prediction(exp, config, a.gpus, a.gpu_type, a.compute, StoreReadings(db))
    except ValueError as e:
        return _fail(str(e))
    if a.format == "json":
        print(json.dumps({"model": exp.name, "config": config.to_dict(), **pred.to_dict()}, indent=1))
    else:
        print(render_text(exp.name, config, pred))
    return 0
