"""The layout space `moetune plan` searches, and its pruning: constraints first (the constraint
table), then memory (the estimate), then the step-time model (price).

A parallel layout (TP, CP, PP with the split Megatron can build, VPP, EP, ETP, micro batch, and the
least recompute that fits) sets the memory; of the settings (dispatcher, EP all-to-all overlap with
or without delayed wgrad, TP-comm overlap, CUDA graph scopes) only the graphs add to it (their
private pools): a scope set whose pools do not fit is tried with more selective recompute, and
dropped for memory where none fits. For each parallel layout only the fastest of its settings that
fit is kept: the others are dominated. Settings are chosen one dimension at a time, in the order
below, each priced with the others at their best so far (the dispatcher and the EP overlap together, since
the overlap does not take every dispatcher); a parallel layout whose step, even with every
communication and launch hidden, is slower than the `keep`-th fastest found is bounded out before
its settings are priced. Sources: moe-optimization-workflow.md (fit first; recompute and CUDA graph
order), moe-comm-overlap.txt (EP overlap, delayed wgrad), moe-dispatcher-selection.txt."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from moetune.estimate import comm
from moetune.estimate.memory import PLAN_HEADROOM_SHARE, estimate, fits_plan, plan_cluster
from moetune.estimate.pricing import price
from moetune.estimate.step import Node, graphed_share
from moetune.experiment.config import TrainingConfig
from moetune.experiment.constraints import check
from moetune.experiment.pipeline import balanced_layout, split_fields, splits

TPS = (1, 2, 4, 8)  # within a node's NVLink
CPS = (1, 2)
MICRO_BATCHES = (1, 2)
MAX_PP = 32
MAX_VPP = 8
MAX_EP = 128
# the optimizer's sharding: the distributed optimizer, or Megatron FSDP (weights, gradients and
# optimizer states sharded over data parallel), searched where it stands in for a pipeline (PP 1)
SHARDINGS: tuple[dict, ...] = ({"distributed_optimizer": True, "fsdp": False},
                               {"distributed_optimizer": True, "fsdp": True})
# the settings' dimensions, in the order they are chosen; each value a dict of TrainingConfig fields
DISPATCHER_VALUES: tuple[dict, ...] = (
    {"dispatcher": "alltoall", "flex_backend": None}, {"dispatcher": "allgather", "flex_backend": None},
    {"dispatcher": "flex", "flex_backend": "deepep"}, {"dispatcher": "flex", "flex_backend": "hybridep"})
EP_OVERLAP_VALUES: tuple[dict, ...] = (
    {"overlap_ep_a2a": False, "delay_wgrad": False}, {"overlap_ep_a2a": True, "delay_wgrad": False},
    {"overlap_ep_a2a": True, "delay_wgrad": True})
TP_OVERLAP_VALUES: tuple[dict, ...] = ({"tp_comm_overlap": False}, {"tp_comm_overlap": True})
# TE-scoped partial graphs for dropless MoE, widened in the workflow's order; the router's and
# preprocess's alone first, the scopes the Model Zoo's Qwen3-235B H100 run graphs (run_h100_235b.sh),
# whose pools are small beside attention's
GRAPH_VALUES: tuple[dict, ...] = (
    {"cuda_graph_impl": "none", "cuda_graph_modules": ()},
    {"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ("moe_router", "moe_preprocess")},
    {"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ("attn",)},
    {"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ("attn", "moe_router")},
    {"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ("attn", "moe_router", "moe_preprocess")})
# none of the settings on: what a first trial runs (moe-comm-overlap.txt: overlap is no bring-up step)
SETTINGS_OFF = {**DISPATCHER_VALUES[0], **EP_OVERLAP_VALUES[0], **TP_OVERLAP_VALUES[0], **GRAPH_VALUES[0]}
# a first trial's layout (`moetune new`): the settings off, one sequence a micro batch, no CP
BRING_UP = {**SETTINGS_OFF, "micro_batch": 1, "cp": 1}
MEMORY = "memory"  # the reason a layout over the GPU's memory is dropped


def recompute_ladder(m, base: TrainingConfig) -> list[dict]:
    """Recompute from none to full, each rung adding modules in the workflow's order of first
    choices (norms and the expert activation, then the model's own: MLA's up-projections, then core
    attention, the dense MLPs and shared experts); full recompute last."""
    first = ["moe_act", "layernorm"] if base.grouped_gemm else ["layernorm"]
    rungs = [first]
    if m.multi_latent_attention:
        rungs.append(["mla_up_proj", *rungs[-1]])
    rungs.append([*rungs[-1], "core_attn"])
    more = (["mlp"] if m.first_dense_layers or m.num_experts <= 1 else []) + (
        ["shared_experts"] if m.moe_shared_expert_intermediate_size else [])
    if more:
        rungs.append([*rungs[-1], *more])
    out: list[dict] = [{"recompute_granularity": None, "recompute_modules": (), "recompute_num_layers": None}]
    out += [{"recompute_granularity": "selective", "recompute_modules": tuple(r), "recompute_num_layers": None}
            for r in rungs]
    out.append({"recompute_granularity": "full", "recompute_modules": (), "recompute_num_layers": 1})
    return out


def pipeline_split(m, pp: int, vpp: int | None) -> dict:
    """The split fields for the model's layers over PP x VPP: split_fields' where Megatron builds
    one of those, else a layout string (DeepSeek's form), else the even split (refused)."""
    if pp <= 1 or splits(m.num_layers, pp, vpp):
        return split_fields(m.num_layers, pp, vpp)
    text = balanced_layout(m.num_layers, m.mtp_num_layers, pp, vpp)
    if text is None:  # the even split, which the constraint table refuses, saying why
        return split_fields(m.num_layers, pp, vpp)
    return {**split_fields(m.num_layers, pp, None), "first_pp_layers": None, "last_pp_layers": None,
            "pp_layout": text}


@dataclass
class Found:
    """One parallel layout that fits, with the settings kept for it."""
    config: TrainingConfig
    """The layout with its fastest settings."""
    memory_gb: float
    """Its estimate with those settings, fixed overhead included (of the settings only CUDA graphs add)."""
    breakdown: dict
    """The estimate's parts (Estimate.to_dict)."""
    measured_gb: float | None
    """A fit's or run's measured peak of the layout, where the store holds one."""
    step_ms: float
    """Its predicted step with those settings."""


@dataclass
class Space:
    """What the search went through, for `plan` to say: layouts considered, those that fit, and
    why the rest were dropped; settings priced for the fitting ones and why those not kept were."""
    considered: int = 0
    """Parallel layouts (with recompute) put to the constraint table."""
    dropped: Counter = field(default_factory=Counter)
    """Layouts dropped, by reason: a constraint's code (the first it breaks) or "memory"."""
    fit: list[Found] = field(default_factory=list)
    """The layouts that pass the constraints and fit, each with its best settings."""
    settings_priced: int = 0
    """Settings priced beyond each fitting layout's first price (none of them on)."""
    settings_dropped: Counter = field(default_factory=Counter)
    """Settings not kept, by reason: a constraint's code, or "dominated" (another setting of the
    same layout as fast or faster at the same memory)."""
    bounded: int = 0
    """Fitting layouts whose settings were not searched: even with every communication and launch
    hidden they are slower than the `keep`-th fastest (listed with none of the settings on)."""
    keep: int = 10
    """How many of the fastest layouts the bound keeps searching for."""
    refused: list[list] = field(default_factory=list)
    """Each dropped layout's violations (empty: its memory), as memory.plan gives them."""

    def counts(self) -> dict:
        """The search's counts as `plan --format json` gives them (the text's two lines)."""
        return {"considered": self.considered, "fit": len(self.fit), "dropped": dict(self.dropped.most_common()),
                "settings_priced": self.settings_priced, "settings_dropped": dict(self.settings_dropped.most_common()),
                "bounded": self.bounded, "keep": self.keep}


def _grid(exp, world: int, base: TrainingConfig, fixed: dict):
    """The parallel layouts, before recompute: dicts of TrainingConfig fields."""
    m = exp.model

    def keep(name: str, values) -> list:
        return [v for v in values if v == fixed[name]] if name in fixed else list(values)

    divisors = [d for d in range(1, min(world, MAX_PP) + 1) if world % d == 0]
    eps = [e for e in range(1, min(m.num_experts, MAX_EP) + 1) if m.num_experts % e == 0] if m.num_experts > 1 else [1]
    # a fixed --fsdp keeps one sharding, or both grid points would become the same layout
    shards = [s for s in SHARDINGS if all(fixed.get(k, v) == v for k, v in s.items())]
    for tp in keep("tp", [t for t in TPS if world % t == 0]):
        for cp in keep("cp", CPS):
            for pp in keep("pp", [p for p in divisors if world % (tp * cp * p) == 0]):
                for vpp in keep("vpp", [None] + (list(range(2, MAX_VPP + 1)) if pp > 1 else [])):
                    split = pipeline_split(m, pp, vpp)
                    for ep in keep("ep", [e for e in eps if world % (e * pp) == 0]):
                        for etp in keep("etp", sorted({1, tp})):
                            if world % (etp * ep * pp):
                                continue
                            for mb in keep("micro_batch", MICRO_BATCHES):
                                for shard in shards:
                                    # FSDP stands in for a pipeline; beside one only where a
                                    # pipeline is asked for (--pp, or --vpp above 1)
                                    if shard["fsdp"] and pp > 1 and "pp" not in fixed and not fixed.get("vpp"):
                                        continue
                                    yield {"tp": tp, "cp": cp, "pp": pp, "vpp": vpp, **split, "ep": ep, "etp": etp,
                                           "sequence_parallel": tp > 1, "micro_batch": mb, **shard}


def _settings_dims(exp, cluster, cfg: TrainingConfig, fixed: dict) -> list[list[dict]]:
    """The settings' values that apply to this layout, dimension by dimension (a fixed field keeps
    its value; a dispatcher the image lacks is left out)."""
    has = {"deepep": bool(cluster.has_deep_ep), "hybridep": bool(cluster.has_hybrid_ep)}
    moe = exp.model.num_experts > 1 and cfg.ep > 1
    dispatchers = [v for v in DISPATCHER_VALUES if v["flex_backend"] is None or has[v["flex_backend"]]]
    # the dispatcher and the EP overlap chosen together: the overlap does not take every dispatcher
    dims = [[{**d, **o} for d in dispatchers for o in EP_OVERLAP_VALUES] if moe else [],
            list(TP_OVERLAP_VALUES) if cfg.tp > 1 else [],
            list(GRAPH_VALUES)]
    return [[v for v in dim if all(fixed.get(k, x) == x for k, x in v.items())] for dim in dims]


def search_space(exp, readings, gpus: int | None = None, gpu_type: str | None = None, keep: int = 10,
                 fixed: dict | None = None, measured=None,
                 headroom_share: float = PLAN_HEADROOM_SHARE) -> Space:
    """Every parallel layout of the experiment's model on its cluster (gpus / gpu_type applied)
    through the constraints, then the memory estimate (the least recompute that fits; a measured
    peak that fits counts), then the step-time model over its settings. `keep`: how many of the
    fastest layouts are priced in full; a layout that cannot beat them is bounded out. `fixed`:
    fields every candidate keeps. `measured`: a config's measured peak, where the store holds one."""
    fixed = dict(fixed or {})
    cluster, world, capacity = plan_cluster(exp, gpus, gpu_type)
    m, base = exp.model, exp.baseline
    # the candidates' settings start from none of them on
    base = base.replace(**SETTINGS_OFF)
    ladder = recompute_ladder(m, base)
    if "recompute_granularity" in fixed or "recompute_modules" in fixed:
        ladder = [{k: fixed.get(k, base.__dict__[k]) for k in ladder[0]}]
    out = Space(keep=keep)
    limit = (1 - headroom_share) * capacity
    fitting: list[tuple[TrainingConfig, object, float | None]] = []
    # the least rung of the ladder a layout at a smaller micro batch needed (its memory grows with
    # the micro batch): where none fitted, none fits at a larger one
    needs: dict[tuple, int | None] = {}
    fits = _fits(m, world, capacity, measured, headroom_share)
    for fields in _grid(exp, world, base, fixed):
        cfg = base.replace(**{**fields, **ladder[0], **fixed})
        out.considered += 1
        violations = check(cfg, m, cluster)
        if violations:
            out.dropped[violations[0].code] += 1
            out.refused.append(violations)
            continue
        key = tuple((k, v) for k, v in fields.items() if k != "micro_batch")
        start = needs.get(key, 0)
        found = None if start is None else _least_recompute(m, cfg, world, ladder, start, limit, fits,
                                                              cluster, measured, fixed)
        if measured is None:  # a measured peak may fit where the estimate does not: no shortcut then
            needs[key] = None if found is None else found[3]
        if found is None:
            out.dropped[MEMORY] += 1
            out.refused.append([])
            continue
        fitting.append(found[:3])
    # graphs whose pools do not fit may fit with more selective recompute (the workflow: revisit
    # recompute after enabling graphs; TE's graphs pair with selective recompute, not full)
    rungs = [r for r in ladder if r["recompute_granularity"] != "full"] if len(ladder) > 1 else []
    _price_settings(exp, cluster, readings, gpus, gpu_type, fitting, keep, fixed, out, fits, rungs)
    out.fit.sort(key=lambda f: f.step_ms)
    return out


def _least_recompute(m, cfg, world, ladder, start, limit, fits, cluster, measured, fixed):
    """(config, estimate, measured peak, rung) at the first rung of the recompute ladder from
    `start` that fits and passes the constraints; None where none does (the last rung is tried
    second: where full recompute does not fit, nothing less does; then the rungs between are
    halved, a rung the constraints refuse taken as one that does not fit)."""
    def tried(i: int):
        c = cfg.replace(**{**ladder[i], **fixed})
        if check(c, m, cluster):
            return None
        # the first stage holds the most micro batches in flight: where it alone is over, the
        # layout is (its estimate is the heaviest stage's), unless a measured peak says otherwise
        if c.pp > 1 and measured is None and estimate(m, c, world, stage=0).total_gb > limit:
            return None
        found = fits(c)
        return (c, *found, i) if found else None

    first = tried(start)
    if first is not None or start == len(ladder) - 1:
        return first
    low, high = start, len(ladder) - 1  # low does not fit, high is to be shown to
    best = tried(high)
    if best is None:
        return None
    while high - low > 1:  # each rung frees more than the one before: halve the rungs between
        mid = (low + high) // 2
        found = tried(mid)
        if found is None:
            low = mid
        else:
            high, best = mid, found
    return best


def _fits(m, world: int, capacity: float, measured, headroom_share: float):
    """A config's test of fit (memory.fits_plan), for the recompute ladder and the graphs alike:
    (its estimate, its measured peak or None) where it fits, else None."""
    def fits(c: TrainingConfig):
        est, peak = estimate(m, c, world), measured(c) if measured else None
        return (est, peak) if fits_plan(est.total_gb, capacity, peak, headroom_share) else None
    return fits


def _graphs_fit(m, cluster, c: TrainingConfig, fits, rungs: list[dict]):
    """(config, (estimate, measured peak)) of a CUDA graph setting at the layout's recompute, or else
    at the least selective rung above it where the graphs' pools fit and the constraints pass;
    (c, None) where none does."""
    est = fits(c)
    if est is not None:
        return c, est
    now = {k: getattr(c, k) for k in rungs[0]} if rungs else None
    above = rungs[rungs.index(now) + 1:] if now in rungs else []
    for rung in above:
        t = c.replace(**rung)
        if check(t, m, cluster):
            continue
        est = fits(t)
        if est is not None:
            return t, est
    return c, None


def _lower_bound(exp, cluster, readings, cfg: TrainingConfig, p) -> float:
    """The step no settings of this layout can beat: the slowest stage's compute, pipeline and CP
    sends, its all-to-all at the cheapest dispatcher with the most EP overlap hides, its TP
    collectives with the most TP-comm overlap hides, or the host's launches that the widest CUDA
    graphs leave where they take longer, with its fill and drain; the
    data-parallel sync and the optimizer (no setting changes them)."""
    t, mb = p.terms, p.inputs["micro_batches"]
    rates = readings.rates(cluster, exp.model, cfg)[0]
    a2a = t["ep_a2a"]
    if a2a:
        node = Node.of(cluster)
        ms = [comm.a2a(exp.model, cfg.replace(**d), node.gpu_type, node.nvlink_domain, rates)["ms"]
              for d in DISPATCHER_VALUES]
        overlap = cfg.pp == 1 or cfg.vpp is not None  # the EP overlap needs VPP where PP > 1
        a2a *= min(ms) / p.inputs["ep_a2a_per_layer"]["ms"] * (1 - rates["ep_overlap_hidden"] * overlap)
    tp = t["tp_collectives"] * (1 - rates["tp_overlap_hidden"])
    # the widest scopes replay the most launches
    host = p.inputs["host_launch_ms_per_micro_batch"] * (1 - graphed_share(cfg.replace(**GRAPH_VALUES[-1]), rates))
    per = max((t["compute"] + t["pp_sends"] + t["cp_exchange"] + a2a + tp) / mb, host)
    fill = p.inputs["bubble_fraction"] * mb * per
    return per * mb + fill + t["dp_grad_reduce"] + t["dp_param_gather"] + t["optimizer"]


def _price_settings(exp, cluster, readings, gpus, gpu_type, fitting, keep, fixed, out: Space, fits,
                    rungs: list[dict]) -> None:
    """Each fitting layout's fastest settings, into out.fit; the settings not kept counted by reason
    (CUDA graphs whose pools do not fit: memory)."""
    priced = []
    for cfg, est, peak in fitting:
        try:
            p = price(exp, cfg, readings, gpus, gpu_type)
        except ValueError:  # the rules refuse what the model cannot price: a guard, not a reason met
            out.dropped["unpriced"] += 1
            continue
        priced.append((cfg, est, peak, p))
    # the fastest possible first, so that the bound tightens early
    # (a measured compute is keyed by the graphs too: no bound for those)
    bounds = [_lower_bound(exp, cluster, readings, x[0], x[3]) if x[3].compute_source == "analytic" else 0.0
              for x in priced]
    best: list[float] = []
    for bound, (cfg, est, peak, p) in sorted(zip(bounds, priced, strict=True), key=lambda x: x[0]):
        dims = _settings_dims(exp, cluster, cfg, fixed)
        if len(best) >= keep and bound >= best[keep - 1]:
            out.bounded += 1
            out.fit.append(Found(cfg, est.total_gb, est.to_dict(), peak, p.step_time_ms))
            continue
        cur, step = cfg, p.step_time_ms
        for dim in dims:
            for value in dim:
                if all(getattr(cur, k) == v for k, v in value.items()):
                    continue
                trial = cur.replace(**value)
                violations = check(trial, exp.model, cluster)
                if violations:
                    out.settings_dropped[violations[0].code] += 1
                    continue
                grown = None
                if trial.cuda_graph_impl != cur.cuda_graph_impl or trial.cuda_graph_modules != cur.cuda_graph_modules:
                    trial, grown = _graphs_fit(exp.model, cluster, trial, fits, rungs)
                    if grown is None:
                        out.settings_dropped[MEMORY] += 1
                        continue
                try:
                    q = price(exp, trial, readings, gpus, gpu_type)
                except ValueError:
                    continue
                out.settings_priced += 1
                if q.step_time_ms < step:
                    cur, step = trial, q.step_time_ms
                    if grown:  # the graphs' own estimate, and a peak measured with them or none
                        est, peak = grown
                    out.settings_dropped["dominated"] += 1  # the one it replaced
                else:
                    out.settings_dropped["dominated"] += 1
        out.fit.append(Found(cur, est.total_gb, est.to_dict(), peak, step))
        best = sorted([*best, step])[:keep]


def image_lacks(cluster) -> list[str]:
    """The flex backends the cluster's image does not have (left out of the search)."""
    return [b for b, has in (("deepep", cluster.has_deep_ep), ("hybridep", cluster.has_hybrid_ep)) if not has]

