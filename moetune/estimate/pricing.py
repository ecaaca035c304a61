"""The one entry that prices a layout (`price`): `moetune predict`, `moetune plan` and the tuner's
model (tune/predicted.py) all call it, with the same readings of the store, so a layout has one
predicted step wherever it is asked for."""
from __future__ import annotations

from moetune.estimate.band import band
from moetune.estimate.memory import min_gpus, plan_cluster
from moetune.estimate.readings import StoreReadings
from moetune.estimate.step import Node, Prediction, predict
from moetune.experiment.config import TrainingConfig


def price(exp, config: TrainingConfig, readings: StoreReadings, gpus: int | None = None,
          gpu_type: str | None = None, compute: str | None = None, with_band: bool = False) -> Prediction:
    """The prediction of `config` (step time, tokens/s/GPU, its terms, what it read) on the
    experiment's cluster with `gpus` / `gpu_type` applied (plan_cluster), at the rates of the
    cluster's latest calibration in `readings`. compute: "fit" (a measurement of the layout in the
    store required), "analytic", or None (a measurement where there is one). ValueError, one line,
    for a layout the GPUs or the batch cannot hold. with_band: the prediction's band too (band.py:
    the layout priced again at each rate's two ends, a few dozen times its cost)."""
    cluster, world, _ = plan_cluster(exp, gpus, gpu_type)
    if world < 1:  # a CPU stand-in's cluster: no GPU to price
        raise ValueError(f"cluster {cluster.name} has no GPUs (gpus_per_node {cluster.gpus_per_node})")
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
    node, measured_ms = Node.of(cluster), measured[0] if measured else None
    p = predict(exp.model, config, node, world, rates=rates, measured_ms=measured_ms)
    if with_band:
        p.band = band(lambda r: predict(exp.model, config, node, world, rates=r, measured_ms=measured_ms).step_time_ms,
                      rates, p.step_time_ms)
    if calibration:
        p.inputs["calibration"] = calibration
        p.inputs["rates_measured"] = sorted(n for n, r in rates.rows.items() if r.source.startswith("measured:"))
    if measured:
        p.inputs["measured_compute"] = measured[1]
    return p
