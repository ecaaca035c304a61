"""estimate/search.py: what bounds a search where no layout can run."""
from __future__ import annotations

import pytest

from moetune.estimate.search import batch_bound
from moetune.experiment.schema import load_experiment


def test_the_global_batch_bounds_the_gpus_it_can_feed():
    """qwen3_30b_a3b's global batch 1024 at micro batch 1 feeds 1024 data-parallel ranks: up to
    8x32x2 model-parallel GPUs each (the search's largest TP, PP and CP), 524288 GPUs; past that the bound
    names the batch, within it there is none."""
    exp = load_experiment("qwen3_30b_a3b")
    assert exp.baseline.global_batch == 1024 and exp.baseline.micro_batch == 1 and exp.baseline.cp == 1
    assert batch_bound(exp, 524288) is None and batch_bound(exp, 64) is None
    why = batch_bound(exp, 524289)
    assert why is not None and "global_batch 1024" in why and "at most 1024 data-parallel ranks, 524288 GPUs" in why
    assert "a global batch of 1025 or more" in why


def _space(name, **cluster):
    from moetune.estimate.readings import StoreReadings
    from moetune.estimate.space import search_space
    exp = load_experiment(name)
    if cluster:
        exp = exp.model_copy(update={"cluster": exp.cluster.model_copy(update=cluster)})
    return exp, search_space(exp, StoreReadings.empty())


def test_the_search_counts_add_up_and_settings_keep_memory():
    """Every layout considered either fits or is dropped for one reason (a rule of the constraint
    table, or memory); the fitting ones come fastest first; of the settings chosen for each only the
    CUDA graphs change its estimate (their pools), which is the one the layout is shown with and
    fits."""
    from moetune.estimate.memory import PLAN_HEADROOM_SHARE, estimate, plan_cluster
    from moetune.estimate.space import GRAPH_VALUES, MEMORY, SETTINGS_OFF
    from moetune.experiment.constraints import RULES
    exp, space = _space("qwen3_30b_a3b")
    _, _, capacity = plan_cluster(exp)
    assert space.considered == len(space.fit) + sum(space.dropped.values()) > 1000
    assert set(space.dropped) <= {code for code, *_ in RULES} | {MEMORY}
    steps = [f.step_ms for f in space.fit]
    assert steps == sorted(steps)
    graphed = 0
    for f in space.fit[:20]:
        graphs = {k: getattr(f.config, k) for k in GRAPH_VALUES[0]}
        off = f.config.replace(**{**SETTINGS_OFF, **graphs})
        assert estimate(exp.model, f.config, 16).total_gb == estimate(exp.model, off, 16).total_gb
        assert f.memory_gb == estimate(exp.model, f.config, 16).total_gb <= (1 - PLAN_HEADROOM_SHARE) * capacity
        graphed += f.config.cuda_graph_impl != "none"
    assert graphed
    assert any(f.config.cuda_graph_impl != "none" or f.config.overlap_ep_a2a for f in space.fit[:5])


def test_fsdp_is_searched_without_a_pipeline_and_sheds_memory():
    """Megatron FSDP is a value of the optimizer's sharding where it stands in for a pipeline: every
    FSDP layout found is at PP 1, some fit, and each holds less memory than the same layout with the
    distributed optimizer."""
    from moetune.estimate.memory import estimate
    exp, space = _space("qwen3_30b_a3b")
    fsdp = [f.config for f in space.fit if f.config.fsdp]
    assert fsdp and all(c.pp == 1 for c in fsdp)
    for c in fsdp[:10]:
        assert estimate(exp.model, c, 16).total_gb < estimate(exp.model, c.replace(fsdp=False), 16).total_gb


def test_the_dispatchers_searched_are_those_the_image_has():
    """Without DeepEP in the image no layout takes the flex dispatcher; with it (and HybridEP), some do."""
    _, without = _space("qwen3_30b_a3b", has_deep_ep=False)
    assert all(f.config.dispatcher != "flex" for f in without.fit)
    _, both = _space("qwen3_30b_a3b", has_deep_ep=True, has_hybrid_ep=True)
    assert any(f.config.dispatcher == "flex" for f in both.fit[:5])


def _rank(space, **layout):
    return next(i + 1 for i, f in enumerate(space.fit) if all(getattr(f.config, k) == v for k, v in layout.items()))


NVIDIA_30B = dict(tp=1, cp=1, pp=1, vpp=None, ep=16, etp=1, micro_batch=1)


def test_nvidia_qwen3_30b_layout_is_among_plans_five_fastest(no_store):
    """Qwen3-30B-A3B on 16 H100: NVIDIA's TP1 PP1 EP16 (flex dispatcher) is among plan's five fastest
    rows, with the flex dispatcher the search chose for it."""
    from moetune.estimate.readings import StoreReadings
    from moetune.estimate.search import search
    found = search(load_experiment("qwen3_30b_a3b"), StoreReadings.empty(), limit=5)
    hits = [lay.config for lay in found.layouts if all(getattr(lay.config, k) == v for k, v in NVIDIA_30B.items())]
    assert len(hits) == 1 and hits[0].dispatcher == "flex"


def test_nvidia_qwen3_235b_layout_is_within_its_band_of_the_fastest():
    """Qwen3-235B on 256 H100: NVIDIA's TP2 PP8 VPP4 EP32 (embedding and loss accounted) is among the
    ten fastest layouts, with the settings of the Model Zoo's H100 run: CUDA graphs of the router and
    preprocess only, whose pools fit once moe_act and layernorm are recomputed (attention's would not,
    nor these without the recompute); the first is faster by less than its band's low end allows;
    each one ahead of it has a smaller all-to-all (EP 16: two nodes' copies, not four), a smaller
    bubble (more virtual stages), less host time (fewer virtual stages: the schedule's passes cost
    the host) or less compute (no recompute, where the layout fits without it: recompute runs its
    modules' forward again, their element-wise bytes and launches too)."""
    from moetune.estimate.memory import PLAN_HEADROOM_SHARE, estimate, plan_cluster
    from moetune.estimate.pricing import price
    from moetune.estimate.readings import StoreReadings
    exp, space = _space("qwen3_235b")
    _, world, capacity = plan_cluster(exp)
    limit = (1 - PLAN_HEADROOM_SHARE) * capacity
    rank = _rank(space, tp=2, cp=1, pp=8, vpp=4, ep=32, etp=1, micro_batch=1)
    nv = space.fit[rank - 1]
    assert 1 < rank <= 10 and nv.config.account_for_embedding and nv.config.account_for_loss
    assert nv.config.cuda_graph_modules == ("moe_router", "moe_preprocess")
    assert nv.config.recompute_modules == ("moe_act", "layernorm") and nv.memory_gb <= limit
    no_recompute = nv.config.replace(recompute_granularity=None, recompute_modules=())
    assert estimate(exp.model, no_recompute, world).total_gb > limit
    attn = nv.config.replace(cuda_graph_modules=("attn", "moe_router", "moe_preprocess"))
    assert estimate(exp.model, attn, world).total_gb > limit
    p = price(exp, nv.config, StoreReadings.empty(), with_band=True)
    best = price(exp, space.fit[0].config, StoreReadings.empty())
    assert p.band is not None and p.band.low_ms < best.step_time_ms < p.step_time_ms
    for f in space.fit[:rank - 1]:
        q = price(exp, f.config, StoreReadings.empty())
        assert (q.terms["ep_a2a"] < p.terms["ep_a2a"] or q.terms["pipeline_bubble"] < p.terms["pipeline_bubble"]
                or q.terms["host_launch"] < p.terms["host_launch"]
                or (q.terms["compute"] < p.terms["compute"] and not f.config.recompute_granularity))


def test_nvidia_deepseek_v3_layout_is_among_the_five_fastest_and_its_estimate_fits():
    """DeepSeek-V3 on 1024 H100: NVIDIA's PP8 VPP4 over 61 layers has no first/last or accounted
    split; the search builds DeepSeek's layout string for it, which the constraint table passes. With
    NVIDIA's recompute (mla_up_proj, mlp) the estimate is within the plan's share of 80 GB, as NVIDIA
    runs it on H100s; the search reaches the layout (with a rung of its own recompute ladder) among
    its five fastest. Megatron FSDP without a pipeline, which hides its gathers and the all-to-all
    behind compute, is not: their traffic over the NIC outlasts its micro-batches."""
    from moetune.estimate.memory import PLAN_HEADROOM_SHARE, estimate
    from moetune.estimate.space import pipeline_split
    from moetune.experiment.constraints import check
    exp, space = _space("deepseek_v3")
    split = pipeline_split(exp.model, 8, 4)
    assert split["pp_layout"] == "Et|(tt|)*30mL"
    nv = exp.baseline.replace(pp=8, vpp=4, ep=64, **split, recompute_modules=("mla_up_proj", "mlp"))
    assert check(nv, exp.model, exp.cluster) == []
    assert estimate(exp.model, nv, 1024).total_gb <= (1 - PLAN_HEADROOM_SHARE) * 80
    rank = _rank(space, tp=2, cp=1, pp=8, vpp=4, ep=64, etp=1, micro_batch=1)
    found = space.fit[rank - 1]
    assert rank <= 5 and found.config.pp_layout == "Et|(tt|)*30mL"
    from moetune.estimate.pricing import price
    from moetune.estimate.readings import StoreReadings
    fsdp = price(exp, exp.baseline.replace(tp=4, pp=1, vpp=None, ep=128, micro_batch=2, fsdp=True, pp_layout=None,
                                           first_pp_layers=None, last_pp_layers=None, dispatcher="flex",
                                           flex_backend="deepep", overlap_ep_a2a=True), StoreReadings.empty())
    stage = max(fsdp.inputs["stage_micro_batch_ms"].values())
    assert stage == pytest.approx(fsdp.inputs["nic_ms_per_micro_batch"]) and fsdp.step_time_ms > space.fit[4].step_ms


def test_a_measurement_decides_the_fit_both_ways():
    """The recorded one-GPU study (benchmarks/one_gpu_tuning, qwen3_235b on 256 H100): the layout
    whose run ran out of memory (TP2 PP2 EP128 with TE's CUDA graphs, trial id 9) is out of memory on
    an H100 whatever its estimate, and says nothing of a larger GPU; EP 64 (id 7) measured 74.4
    GB, which with the fit's headroom exceeds the H100; EP 128 without graphs measured 68.9 and
    fits. fits_plan takes a measurement over the estimate in both directions."""
    import math

    from moetune.estimate.memory import OUT_OF_MEMORY, fits_plan
    from moetune.estimate.readings import StoreReadings
    from moetune.estimate.search import layout_key, measured_peaks
    from moetune.experiment.config import TrainingConfig
    from moetune.experiment.gpus import GPUS
    from moetune.paths import ROOT
    from moetune.store import Store

    store = Store(str(ROOT / "benchmarks" / "one_gpu_tuning" / "moetune.db"), read_only=True)
    (study,) = [s for s in store.studies() if s.model == "qwen3_235b"]
    trials = {t.id: t for t in store.trials(study.id)}  # ids as the study report names them
    key = {n: layout_key(TrainingConfig.from_dict(trials[n].config).to_dict()) for n in trials}
    exp = load_experiment("qwen3_235b")
    h100, h200 = GPUS["H100"].memory_gb, GPUS["H200"].memory_gb
    peaks = measured_peaks(exp, 256, StoreReadings(store=store), h100)
    oom = [n for n in trials if trials[n].state == "oom"]
    assert oom and all(peaks[key[n]] == OUT_OF_MEMORY for n in oom)
    larger = measured_peaks(exp, 256, StoreReadings(store=store), h200)
    assert all(not math.isinf(larger.get(key[n], 0.0)) for n in oom)
    ep64, ep128 = peaks[key[7]], peaks[key[8]]  # raise_ep's two layouts
    assert (TrainingConfig.from_dict(trials[7].config).ep, TrainingConfig.from_dict(trials[8].config).ep) == (64, 128)
    assert ep64 == pytest.approx(74.4, abs=0.05) and ep128 == pytest.approx(68.9, abs=0.05)
    # an estimate of 60 GB would fit, of 75 not; the measurements decide
    assert fits_plan(60.0, h100) and not fits_plan(60.0, h100, ep64) and not fits_plan(60.0, h100, OUT_OF_MEMORY)
    assert fits_plan(75.0, h100, ep128) and not fits_plan(75.0, h100)
