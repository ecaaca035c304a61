"""Where a study's trials run, decided once when the study starts and stored with it.

    cluster  every trial is its layout's whole job: all `world` ranks, one GPU each
    one_gpu  every trial is one rank of the layout alone on one GPU under Megatron's fake process
             group (tuning.one_gpu, `moetune tune --one-gpu`; experiment/fit.py one_gpu_config),
             running the study's step of `samples` sequences per data-parallel rank

The tuner (tune/loop.py) decides it and keeps it in the study's record under `placement`; every
reader asks `Placement.of_study(record)`. A record stored before placements were kept reads back
the placement its `tuning.one_gpu` (and `tuning.one_gpu_samples`) implied.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, get_args

from moetune.experiment.schema import ConfigError, Tuning, cluster_section

PlacementKind = Literal["cluster", "one_gpu"]
KINDS: tuple[str, ...] = get_args(PlacementKind)


@dataclass(frozen=True)
class Placement:
    """Where a study's trials run (the module's docstring)."""
    kind: PlacementKind
    """cluster: the layout's whole job; one_gpu: one rank of it alone on one GPU."""
    world: int
    """Ranks of the production layout the trials stand for (Cluster.world)."""
    samples: int | None = None
    """One GPU: sequences per data-parallel rank in every trial's step (decide/one_gpu.py); else
    None, as in a record that names no step yet (its trials cannot render until it does)."""
    rank: int | None = None
    """One GPU: the rank a trial's job runs alone. None in the study's placement: each trial's
    layout picks its own (trial/stages.py one_gpu_rank, then `at_rank`)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"placement kind {self.kind!r}: use one of {', '.join(KINDS)}")

    @property
    def one_gpu(self) -> bool:
        """Every trial runs one rank of its layout alone on one GPU."""
        return self.kind == "one_gpu"

    @property
    def gpus(self) -> int:
        """GPUs one trial's job gets: one for a one-GPU study, else the layout's world."""
        return 1 if self.one_gpu else self.world

    def at_rank(self, rank: int) -> Placement:
        """This placement for one trial whose job runs `rank` alone (one GPU only)."""
        return replace(self, rank=int(rank)) if self.one_gpu else self

    @classmethod
    def decide(cls, tuning: Tuning, world: int, samples: int | None = None) -> Placement:
        """The study's placement: one GPU where `tuning.one_gpu` asks for it, running the step of
        `samples` its planning decided (decide/one_gpu.py plan_samples); else the whole cluster."""
        if tuning.one_gpu:
            return cls("one_gpu", int(world), int(samples) if samples is not None else None)
        return cls("cluster", int(world))

    def to_dict(self) -> dict:
        """The placement as a study's record keeps it (JSON); the study's, without a rank."""
        return {"kind": self.kind, "world": self.world, "samples": self.samples, "gpus": self.gpus}

    @classmethod
    def from_dict(cls, d: dict) -> Placement:
        """A stored placement (to_dict's dict); ConfigError (one line) where it is not one."""
        try:
            return cls(d["kind"], int(d["world"]), None if d.get("samples") is None else int(d["samples"]),
                       None if d.get("rank") is None else int(d["rank"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"stored placement {d!r}: {e}; it needs kind and world") from None

    @classmethod
    def of_study(cls, record: dict | None, world: int | None = None) -> Placement:
        """The placement of a study from its stored record (`Study.experiment`): the one stored
        there, else (a study stored before placements were kept) the one its tuning implies, of
        `world` ranks where given, else its stored cluster's."""
        record = record or {}
        stored = record.get("placement")
        if isinstance(stored, dict):
            return cls.from_dict(stored)
        tuning = Tuning.from_stored(record.get("tuning"))
        if world is None:
            world = cluster_section(record.get("cluster") or {}).world
        return cls.decide(tuning, world, tuning.one_gpu_samples)
