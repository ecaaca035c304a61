"""What a prediction reads from the store: its trials with their metrics, each measured layout's
compute (a fit's, a one-GPU trial's), and the latest calibration of each cluster. `moetune plan`,
`moetune predict` and the tuner's model read it alike, so they price a layout alike."""
from __future__ import annotations

import json

from moetune.estimate.measured import rates_for
from moetune.experiment import fit
from moetune.experiment.config import TrainingConfig
from moetune.store import NoStore, Store

# the fields a rank's compute and host time depend on: a measurement of a layout stands for
# another that differs elsewhere only (its batch, dispatcher, overlaps, optimizer)
COMPUTE_KEYS = ("tp", "pp", "vpp", "first_pp_layers", "last_pp_layers", "account_for_embedding",
                "account_for_loss", "pp_layout", "cp", "ep", "etp", "sequence_parallel",
                "micro_batch", "seq_length", "recompute_granularity", "recompute_modules", "recompute_num_layers",
                "fp8_format", "fp8_recipe", "cuda_graph_impl", "cuda_graph_modules", "grouped_gemm",
                "permute_fusion", "transformer_impl", "offload_modules")


def compute_key(c: TrainingConfig) -> tuple:
    """The config's COMPUTE_KEYS values: equal for layouts whose measured compute stands for each other."""
    d = c.to_dict()
    return tuple(json.dumps(d[k], sort_keys=True) for k in COMPUTE_KEYS)


class StoreReadings:
    """What predictions read from the store (`db`, else MOETUNE_DB, else .moetune/moetune.db; none
    is created; or an open `store`), read once for a command however many layouts it prices: every
    trial with its metrics (read once: plan's measured peaks read them too), each measured layout's
    compute, and the latest calibration of each cluster. refresh() forgets them (a store written
    while it is read: the tuner's)."""

    def __init__(self, db: str | None = None, store: Store | None = None):
        if store is None:
            try:
                store = Store(db, read_only=True)
            except NoStore:
                store = None
        self.store = store
        self.refresh()

    @classmethod
    def empty(cls) -> StoreReadings:
        """Readings of no store: the published rates, no measurement."""
        out = cls.__new__(cls)
        out.store = None
        out.refresh()
        return out

    def refresh(self) -> None:
        """Forget what was read: the next question reads the store again."""
        self._trials: list[tuple] | None = None
        self._compute: list[tuple] | None = None
        self._calibrations: dict = {}

    def trials(self) -> list[tuple]:
        """(study, trial, its metrics) of every trial in the store, read on first use."""
        if self._trials is None:
            self._trials = []
            if self.store is not None:
                self._trials = [(study, t, self.store.metrics(t.id)) for study in self.store.studies()
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
                                  (f"fit of trial {t.id} ({study.name}): {m['fit_compute_ms']:.0f} ms a step "
                                   f"of {fit.fit_micro_batches(cfg)} micro-batches")))
                if one_gpu and samples and m.get("judged_step_time_ms") and t.state == "completed":
                    n = samples // cfg.micro_batch
                    found.append((m["judged_step_time_ms"] / n, (f"one-GPU trial {t.id} ({study.name}): "
                                  f"{m['judged_step_time_ms']:.0f} ms a step of {n} micro-batches")))
                gpu_type = (experiment.get("cluster") or {}).get("gpu_type")
                self._compute += [(study.model, gpu_type, compute_key(cfg), ms, src) for ms, src in found]
        return self._compute

    def measured_compute(self, exp, config: TrainingConfig, gpu_type: str) -> tuple[float, str] | None:
        """(ms of one micro-batch on the layout's slowest measured rank, where from): a fit's step of
        its fit_micro_batches, or a one-GPU trial's judged step of its samples, of this model on this
        GPU type; the fastest such record wins."""
        if not self._measurements():  # none to match: spare the key (plan asks thousands of times)
            return None
        want = compute_key(config)
        found = [(ms, src) for model, gpu, key, ms, src in self._measurements()
                 if model in (exp.name, exp.model.name) and gpu == gpu_type and key == want]
        return min(found) if found else None

    def rates(self, cluster, model, config: TrainingConfig):
        """The rate table with the latest calibration of the cluster over the published rows
        (`moetune calibrate`), and which calibration; the published rows alone without one."""
        if cluster.name not in self._calibrations:
            self._calibrations[cluster.name] = self.store.latest_calibration(cluster.name) if self.store else None
        return rates_for(self._calibrations[cluster.name], cluster, model, config)
