"""Fit first, on one GPU: which ranks of a layout bound its memory, how they run alone, and when a
measured fit lets a layout onto the cluster.

megatron-core 0.19.2's `--fake-process-group` runs one rank of any layout in one process: with
WORLD_SIZE and RANK set to the target job's, every collective and point-to-point transfer is
skipped, so that rank's memory and kernels are real at the production shapes
(moe-optimization-workflow.md, Phase 1 "make the run memory-feasible"; the Megatron-Core MoE README,
Step 1). ../shared/device-notes.md says what it takes there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from moetune.errors import MoetuneError
from moetune.experiment.config import TrainingConfig
from moetune.experiment.pipeline import chunk_layers, mtp_rank

FIT_ITERS = 3  # Megatron reports memory after iteration 2, when the optimizer states exist
FAKE_GROUP_ARGS = ("--fake-process-group",)
# Megatron captures CUDA graphs after --cuda-graph-warmup-steps (default 3) iterations, and their
# private pools then hold GBs more: a 3-iteration fit of qwen3_235b's EP-128 layout with TE graphs
# peaked at 69 GB and fitted, and its trial ran out of memory at capture, 26.8 GB in graph pools
# (on an H100). So a graphed layout's fit runs two iterations past the capture.
CUDA_GRAPH_WARMUP_STEPS = 3


def fit_iterations(config: TrainingConfig) -> int:
    if config.cuda_graph_impl in (None, "none"):
        return FIT_ITERS
    return max(FIT_ITERS, CUDA_GRAPH_WARMUP_STEPS + 2)


# What the fake group does not allocate, added to the measured peak before it is compared with the
# GPU's memory: NCCL's buffers (per communicator; a rank of TP, EP, DP and PP groups holds several)
# and uneven routing (the fit routes statically, perfectly balanced; real routing sends some experts
# more tokens than others, and the allocator's fragmentation grows with it). One communicator of two
# H200s held 1,282 MiB per rank outside PyTorch's allocator after an all-reduce and an all-to-all
# (benchmarks/device/recipe_workload.py); a rank of several groups holds more.
NCCL_BUFFERS_GB = 3.0
ROUTING_IMBALANCE_SHARE = 0.05  # of the GPU's memory


def static_routing(config: TrainingConfig) -> TrainingConfig:
    """The layout as one rank can run it under the fake group: static routing (the dropless
    all-to-all sizes its buffers from token counts that the skipped collectives never fill:
    capacity 1.0 with padding makes them fixed) on the all-to-all dispatcher (Megatron refuses the
    flex dispatcher under the fake group)."""
    return config.replace(dispatcher="alltoall", flex_backend=None, deepep_num_sms=None,
                          hybridep_num_sms=None, capacity_factor=1.0, pad_to_capacity=True)


def fit_micro_batches(config: TrainingConfig) -> int:
    """Micro-batches a fit's step runs. Memory does not grow with the step's micro-batches once
    the pipeline is full: the first stage holds at most PP (interleaved: a few more chunks) in
    flight, and gradients accumulate in place. Two per stage fill it, and the interleaved
    schedule's divisibility by PP holds."""
    return 2 * max(config.pp, 1)


def fit_config(config: TrainingConfig, world: int | None = None) -> TrainingConfig:
    """The config a fit runs: static routing (static_routing) and a few iterations; with `world`,
    a step of fit_micro_batches() per data-parallel rank instead of the production global batch
    (a fit of qwen3_30b_a3b's baseline ran 64 micro-batches a step, 35 s each, for a peak that 2
    give)."""
    iters = fit_iterations(config)
    fitted = static_routing(config).replace(
        train_iters=iters, profile_step_start=iters + 1,
        profile_step_end=iters + 1)  # no capture range: a fit is not profiled
    if world:
        shorter = max(config.data_parallel(world), 1) * config.micro_batch * fit_micro_batches(config)
        fitted = fitted.replace(global_batch=min(config.global_batch, shorter))
    return fitted


class OneGpuError(MoetuneError):
    """A config a one-GPU trial cannot run comparably (one line)."""


# The least step a one-GPU study runs (sequences per data-parallel rank): a few micro-batches, so
# that the optimizer's step is not most of it. qwen3_30b_a3b's and qwen3_235b's one-GPU studies
# ran 4 (H100, benchmarks/one_gpu_tuning).
ONE_GPU_MIN_SAMPLES = 4


def one_gpu_problem(config: TrainingConfig, samples: int) -> str | None:
    """Why a one-GPU step of `samples` sequences per data-parallel rank cannot run `config`
    comparably (one line); None when it can."""
    if samples % config.micro_batch:
        return (f"micro batch {config.micro_batch} does not divide the one-GPU step's {samples} samples "
                "(tuning.one_gpu_samples)")
    # fewer micro-batches than stages leave the first stage holding fewer in flight than on the
    # cluster: mixtral_8x7b at PP 4, micro batch 2 (core_attn recompute) peaked at 51.6 GB with 2,
    # and ran out of memory past 78 GB with 4 (on an H100): a step that small hides the layout's
    # memory
    if samples < config.pp * config.micro_batch:
        return (f"the one-GPU step's {samples} samples make {samples // config.micro_batch} micro-batches "
                f"of {config.micro_batch}, fewer than the {config.pp} pipeline stages; "
                f"tuning.one_gpu_samples needs {config.pp * config.micro_batch} or more")
    return None


def one_gpu_samples(layouts) -> int:
    """The smallest one-GPU step that runs every (PP, micro batch) of `layouts` comparably: a
    multiple of each micro batch, at least PP micro-batches of each, at least ONE_GPU_MIN_SAMPLES."""
    layouts = list(layouts)
    unit = math.lcm(*(mb for _, mb in layouts))
    need = max([ONE_GPU_MIN_SAMPLES] + [pp * mb for pp, mb in layouts])
    return unit * -(-need // unit)


def one_gpu_config(config: TrainingConfig, world: int, samples: int) -> TrainingConfig:
    """What a one-GPU trial runs (tuning.one_gpu): one rank of the layout alone (bound_rank),
    static routing, and a step of `samples` sequences per data-parallel rank instead of the
    production global batch, so that steps last seconds, not minutes, and every trial of a study
    does the same work per step whatever its micro batch (a larger micro batch is fewer
    micro-batches, as on the cluster). Iterations and the profiled window are the config's own."""
    why = one_gpu_problem(config, samples)
    if why:
        raise OneGpuError(why)
    return static_routing(config).replace(global_batch=max(config.data_parallel(world), 1) * samples)


@dataclass(frozen=True)
class Stage:
    """One pipeline stage of a layout, as its memory and time depend on it."""
    index: int
    layers: int  # decoder layers it builds (the last stage's MTP layers included)
    moe_layers: int  # of them, those with routed experts
    in_flight: int  # micro-batches whose activations it holds at its peak (1F1B: PP - index)


def stage_layer_counts(num_layers: int, config: TrainingConfig) -> list[int]:
    """Decoder layers per pipeline stage as Megatron splits them, in each form of split
    (experiment/pipeline.py: even, uneven first/last stages, embedding/loss accounted, a layout)."""
    return [sum(ranks) for ranks in chunk_layers(num_layers, config)]


def pipeline_stages(model, config: TrainingConfig) -> list[Stage]:
    """Each stage's layers, MoE layers and micro-batches in flight, from the layout and where the
    model's dense layers are (model.layer_kinds). Interleaved (VPP): stage s builds virtual
    stages s, s + PP, ... so the dense layers sit in the first chunks in order. MTP layers are
    built where the layout puts them, else on the last stage (megatron-core's default placement),
    MoE where the model's layers are."""
    pp = max(config.pp, 1)
    chunks = chunk_layers(model.num_layers, config)
    vpp = max(len(ranks) for ranks in chunks)
    counts = [sum(ranks) for ranks in chunks]
    kinds = model.layer_kinds()
    moe = [0] * pp
    layer = 0
    for chunk in range(vpp):
        for s in range(pp):
            size = chunks[s][chunk] if chunk < len(chunks[s]) else 0
            if model.num_experts > 1:
                moe[s] += sum(kinds[layer:layer + size])
            layer += size
    mtp = model.mtp_num_layers
    where = mtp_rank(config, mtp)
    if where is not None:
        counts[where] += mtp
        moe[where] += mtp if model.num_experts > 1 else 0
    return [Stage(s, counts[s], moe[s], pp - s) for s in range(pp)]


def stage_rank(stage: int, config: TrainingConfig, world: int) -> int:
    """A stage's first rank: Megatron orders ranks tp-cp-ep-dp-pp, so a stage is a block of
    world/PP ranks and its first is TP, CP, EP and DP rank 0 (the one that prints Megatron's memory
    report)."""
    return stage * (world // max(config.pp, 1))


def heaviest_moe_stage(stages: list[Stage]) -> Stage | None:
    """The stage with the most MoE layers and, of those, the most micro-batches in flight (the
    earliest); None without MoE layers."""
    moe = [s for s in stages if s.moe_layers]
    return max(moe, key=lambda s: (s.moe_layers, s.in_flight)) if moe else None


def bounding_ranks(config: TrainingConfig, world: int, model=None) -> tuple[int, ...]:
    """The ranks whose memory and time bound the layout's: the first pipeline stage (embedding,
    the most micro-batches in flight), the last (output layer, loss, MTP) and, with `model`, the
    stage with the most MoE layers and micro-batches in flight where that is another (a first
    stage of dense layers only, as deepseek_v3's, shows no expert's memory or time)."""
    if config.pp <= 1 or world < config.pp:
        return (0,)
    stages = [0, config.pp - 1]
    heavy = heaviest_moe_stage(pipeline_stages(model, config)) if model is not None else None
    if heavy and heavy.index not in stages:
        stages.insert(1, heavy.index)
    return tuple(stage_rank(s, config, world) for s in stages)


# Fit step times closer than this share are one: a fit's two or three steady steps vary by a few
# percent from one run to the next, and the trials of a study should profile the same stage
STEP_TIE_SHARE = 0.05


class BoundRank(NamedTuple):
    """The rank a one-GPU trial runs for its layout, and why."""
    rank: int
    stage: int
    why: str

    def to_dict(self) -> dict:
        return self._asdict()


def _seconds(ms: float) -> str:
    return f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:.0f} ms"


def pipeline_layout(config: TrainingConfig) -> tuple:
    """What decides which layers and micro-batches a pipeline rank holds: trials equal in it run
    the same stage on the same rank."""
    return (config.tp, config.pp, config.vpp, config.first_pp_layers, config.last_pp_layers,
            config.account_for_embedding, config.account_for_loss, config.pp_layout,
            config.cp, config.ep, config.etp)


def bound_rank(model, config: TrainingConfig, world: int, measured: dict | None = None) -> BoundRank:
    """The rank that bounds a pipeline's step, for a one-GPU trial: of the stages holding MoE
    layers, the one the fit measured slowest (`measured`: {rank: {step_time_ms}}, fit.json's
    ranks; within STEP_TIE_SHARE, the one with more MoE layers, then more in flight); without a
    measurement of one, the stage with the most MoE layers and micro-batches in flight."""
    if config.pp <= 1 or world < config.pp:
        return BoundRank(0, 0, "the layout has one pipeline stage")
    stages = pipeline_stages(model, config)
    where = f"of {config.pp}"
    timed = {}
    for r, m in (measured or {}).items():
        r = int(r)
        s = r // (world // config.pp)
        if m.get("step_time_ms") and r == stage_rank(s, config, world):
            timed[s] = float(m["step_time_ms"])
    moe_timed = {s: ms for s, ms in timed.items() if stages[s].moe_layers}
    if moe_timed:
        top = max(moe_timed.values())
        pick = max((s for s, ms in moe_timed.items() if ms >= top * (1 - STEP_TIE_SHARE)),
                   key=lambda s: (stages[s].moe_layers, stages[s].in_flight))
        others = ", ".join(f"{_seconds(ms)} for stage {s}" for s, ms in sorted(timed.items()) if s != pick)
        slowest = "slowest measured stage" if timed[pick] >= top else \
            f"within {STEP_TIE_SHARE:.0%} of the slowest measured stage and more MoE layers or in flight"
        why = (f"stage {pick} {where}: {stages[pick].moe_layers} MoE layers, {slowest}, "
               f"{_seconds(timed[pick])} per step" + (f" against {others}" if others else ""))
        dense = [s for s in timed if not stages[s].moe_layers]
        if dense:
            why += f" (stage {', '.join(map(str, sorted(dense)))} holds no MoE layer)"
        return BoundRank(stage_rank(pick, config, world), pick, why)
    heavy = heaviest_moe_stage(stages)
    if heavy is None:
        return BoundRank(0, 0, f"stage 0 {where}: the model has no MoE layer")
    return BoundRank(stage_rank(heavy.index, config, world), heavy.index,
                     f"stage {heavy.index} {where}: {heavy.moe_layers} MoE layers, "
                     f"{heavy.in_flight} micro-batches in flight, the most of any stage; no fit "
                     "measured its step")


def headroom_gb(capacity_gb: float) -> float:
    return NCCL_BUFFERS_GB + ROUTING_IMBALANCE_SHARE * capacity_gb


@dataclass(frozen=True)
class FitVerdict:
    fits: bool
    reason: str
    peak_gb: float | None  # the largest measured peak of the bounding ranks
    headroom_gb: float
    capacity_gb: float
    # None: measured; "oom"; else why no rank measured (the log's failure: Megatron refusing the
    # config at start-up is "python_error"), which no memory fix on top of it can mend
    failure: str | None = None

    def to_dict(self) -> dict:
        return {"fits": self.fits, "reason": self.reason, "peak_gb": self.peak_gb,
                "headroom_gb": round(self.headroom_gb, 2), "capacity_gb": self.capacity_gb,
                "failure": self.failure}


def verdict(ranks: dict, capacity_gb: float) -> FitVerdict:
    """Does the layout fit, from each bounding rank's measurement ({rank: {max_allocated_gb,
    max_reserved_gb, failure}})? A rank that ran out of memory, or that reported no peak, does not."""
    room = headroom_gb(capacity_gb)
    for rank, r in sorted(ranks.items()):
        if r.get("failure") == "oom":
            return FitVerdict(False, f"rank {rank} ran out of memory on one GPU", None, room, capacity_gb,
                              "oom")
        if not r.get("max_allocated_gb"):
            why = r.get("failure_line") or r.get("failure") or "no memory report in its log"
            return FitVerdict(False, f"rank {rank} did not measure ({why})", None, room, capacity_gb,
                              r.get("failure") or "no_report")
    peak_rank, peak = max(((rank, max(r["max_allocated_gb"], r.get("max_reserved_gb") or 0.0))
                           for rank, r in ranks.items()), key=lambda x: x[1])
    total = peak + room
    fits = total <= capacity_gb
    reason = (f"rank {peak_rank} peaks at {peak:.1f} GB; with {room:.1f} GB headroom (NCCL buffers, "
              f"uneven routing) {total:.1f} GB {'fits' if fits else 'exceeds'} the GPU's {capacity_gb:g} GB")
    return FitVerdict(fits, reason, round(peak, 3), room, capacity_gb)


def fit_metrics(fitted: dict) -> dict:
    """A fit's figures as trial metrics: the bounding ranks' peak (or that one ran out of memory),
    and the slowest one's step time alone on one GPU (its compute floor: no communication, no
    waiting, no pipeline bubble)."""
    steps = [r.get("step_time_ms") for r in (fitted.get("ranks") or {}).values() if r.get("step_time_ms")]
    out = {"fit_peak_gb": fitted.get("peak_gb"), "fit_fits": 1.0 if fitted.get("fits") else 0.0,
           # a rank out of memory: plan drops the layout on a GPU this size (estimate/search.py)
           "fit_oom": 1.0 if fitted.get("failure") == "oom" else None}
    if steps:
        out["fit_compute_ms"] = max(steps)
    return {k: v for k, v in out.items() if v is not None}
