"""Megatron's own argument validation (megatron-core 0.19.2, on the CPU in .venv-megatron) agrees
with moetune's renderings and constraint table, both ways: the table's own cases (built to break
moetune's rules) are refused by Megatron where it refuses, and configs drawn from the whole config
space without looking at moetune's rules are never accepted by moetune where Megatron refuses them
(moetune may be stricter: it also refuses what runs slowly or what the cluster lacks)."""
import random

import pytest

from moetune.experiment import megatron_validate as mv
from moetune.experiment.config import run_args
from moetune.experiment.constraints import check
from moetune.experiment.schema import Cluster, load_experiment
from tests.experiment.test_constraints import CASES, H100, MODEL, MODEL_CASES, OK

pytestmark = [pytest.mark.megatron,
              pytest.mark.skipif(not mv.available(), reason="no .venv-megatron (scripts/megatron-venv)")]

# The exact H100 layouts the production experiments render (world = TP×PP×DP = ETP×EP×EDP×PP).
LAYOUTS = {
    "qwen3_235b": (256, dict(tp=2, pp=8, vpp=4, ep=32, etp=1, account_for_embedding=True, account_for_loss=True)),
    "qwen3_30b_a3b": (16, dict(tp=1, pp=1, ep=16, etp=1)),
    "deepseek_v3": (1024, dict(tp=2, pp=16, ep=64, etp=1, first_pp_layers=3, last_pp_layers=2)),
    "mixtral_8x7b": (64, dict(tp=1, pp=4, ep=8, etp=1)),
    "mixtral_8x22b": (128, dict(tp=2, pp=8, ep=8, etp=1)),
}


def test_production_models_accepted_by_megatron():
    """Megatron's validation accepts each production experiment's baseline at its H100 layout."""
    exps = {n: load_experiment(n) for n in LAYOUTS}
    for name, (gpus, layout) in LAYOUTS.items():
        e = exps[name]
        assert e.cluster.gpus == gpus and e.cluster.gpu_type == "H100"
        assert {k: getattr(e.baseline, k) for k in layout} == layout
    argvs = [exps[n].baseline.to_args(exps[n].model) + run_args() for n in LAYOUTS]
    results = mv.validate(argvs, [g for g, _ in LAYOUTS.values()])
    assert dict(zip(LAYOUTS, results)) == {n: None for n in LAYOUTS}


# The uneven pipelines NVIDIA runs, as moetune renders them: (experiment, changes to its baseline)
UNEVEN = [
    ("deepseek_v3", dict(pp=8, vpp=None, pp_layout="Et*3|(tt|)*29m|L", first_pp_layers=None, last_pp_layers=None)),
    ("deepseek_v3", dict(pp=8, first_pp_layers=6, last_pp_layers=7)),
    ("qwen3_235b", dict(pp=8, vpp=None, account_for_embedding=False, account_for_loss=False, first_pp_layers=11,
                        last_pp_layers=11)),
    ("qwen3_235b", {}),  # PP 8 VPP 4, the embedding and the loss counted
]
# ... and near misses both refuse
UNEVEN_REFUSED = [
    ("deepseek_v3", dict(pp=8)),  # first 3, last 2 leave 56 layers for 6 middle stages
    # no MTP layer: 31 stages, which PP 8 does not divide
    ("deepseek_v3", dict(pp=8, vpp=None, pp_layout="Et*3|(tt|)*29|L", first_pp_layers=None, last_pp_layers=None)),
    ("qwen3_235b", dict(account_for_loss=False)),  # 95 over 32 virtual stages
]


def test_uneven_pipelines_moetune_renders_pass_megatron():
    """Megatron's validate_args and TransformerConfig take each uneven form as moetune renders it,
    which moetune's table passes; the near misses both refuse."""
    exps = {n: load_experiment(n) for n, _ in UNEVEN + UNEVEN_REFUSED}
    cases = [(exps[n], exps[n].baseline.replace(**ch)) for n, ch in UNEVEN + UNEVEN_REFUSED]
    results = mv.validate([c.to_args(e.model) + run_args() for e, c in cases], [e.cluster.gpus for e, _ in cases])
    ours = [[v.code for v in check(c, e.model, e.cluster)] for e, c in cases]
    assert results[:len(UNEVEN)] == [None] * len(UNEVEN) and ours[:len(UNEVEN)] == [[]] * len(UNEVEN)
    for (name, changes), theirs, mine in list(zip(UNEVEN + UNEVEN_REFUSED, results, ours, strict=True))[len(UNEVEN):]:
        assert theirs and mine, (name, changes, theirs, mine)


def test_what_megatron_refuses_moetune_refuses():
    """Every forbidden case of the constraint table through Megatron: where Megatron refuses,
    moetune's checker must refuse too (a disagreement fails, naming the case). These cases are built
    from moetune's own rules; the drawn configs below check the other direction."""
    gpus = H100["nodes"] * H100["gpus_per_node"]
    cases = [(code, OK.replace(**changes), {**H100, **cl}) for changes, cl, code in CASES]
    argvs = [cfg.to_args(MODEL, has_apex=cl.get("has_apex", True)) + run_args() for _, cfg, cl in cases]
    worlds = [cl["nodes"] * cl["gpus_per_node"] for _, _, cl in cases]
    results = mv.validate(argvs, worlds)
    refused_by_megatron = [(code, r) for (code, _, _), r in zip(cases, results) if r]
    assert len(refused_by_megatron) >= 10, refused_by_megatron
    disagreements = [(code, r) for (code, cfg, cl), r in zip(cases, results)
                     if r and not check(cfg, MODEL, Cluster(**cl))]
    assert disagreements == []
    assert mv.validate([OK.to_args(MODEL) + run_args()], gpus) == [None]


# The config space the draws below come from: each field's values as a user may set them, chosen
# without reference to moetune's rules.
SPACE = dict(tp=[1, 2, 4], pp=[1, 2, 4], ep=[1, 2, 4, 8, 16], etp=[None, 1, 2], cp=[1, 2],
             sequence_parallel=[False, True], vpp=[None, 2], micro_batch=[1, 2, 4], global_batch=[32, 64, 96],
             dispatcher=["alltoall", "allgather", "flex"], overlap_ep_a2a=[False, True],
             shared_expert_overlap=[False, True], distributed_optimizer=[False, True],
             overlap_param_gather=[False, True], recompute_granularity=[None, "selective", "full"],
             recompute_modules=[(), ("core_attn",), ("moe",), ("moe_act",)], recompute_num_layers=[None, 1],
             grouped_gemm=[False, True], delay_wgrad=[False, True],
             transformer_impl=["transformer_engine", "local"],
             cuda_graph_impl=["none", "local", "transformer_engine"], capacity_factor=[None, 1.0],
             pad_to_capacity=[False, True])


def drawn_configs(n: int, seed: int = 26) -> list:
    """`n` configs a few fields away from OK (1 to 3 fields, each set to a value of SPACE): near a
    valid layout, so Megatron both accepts and refuses a fair share of them."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        keys = rng.sample(sorted(SPACE), rng.choice([1, 2, 3]))
        out.append(OK.replace(**{k: rng.choice(SPACE[k]) for k in keys}))
    return out


def test_what_moetune_accepts_megatron_accepts_on_configs_not_built_from_its_rules():
    """The other direction: 60 drawn configs go through Megatron first. Every one Megatron refuses
    moetune refuses too (none that moetune accepts fails Megatron's validation); the draw holds
    enough of both kinds to mean something. (In the draw made when this test was written, 0 of 60
    were refused by Megatron alone and a handful by moetune alone: stricter rules, e.g. selective
    recompute without modules, the local spec under sequence parallelism.)"""
    configs = drawn_configs(60)
    gpus = H100["nodes"] * H100["gpus_per_node"]
    results = mv.validate([c.to_args(MODEL) + run_args() for c in configs], gpus)
    ours = [check(c, MODEL, Cluster(**H100)) for c in configs]
    accepted_by_both = sum(not r and not o for r, o in zip(results, ours))
    refused_by_megatron = sum(bool(r) for r in results)
    assert accepted_by_both >= 20 and refused_by_megatron >= 10, (accepted_by_both, refused_by_megatron)
    only_megatron = [(c.to_dict(), r) for c, r, o in zip(configs, results, ours) if r and not o]
    assert only_megatron == []


def test_selective_recompute_with_megatrons_default_modules_under_graphed_attention():
    """Selective recompute with no modules named recomputes Megatron's default, core_attn, which
    Megatron refuses under local CUDA graphs of attention (attention dropout): moetune refuses it
    too, by the same row as named core_attn recompute."""
    cfg = OK.replace(recompute_granularity="selective", recompute_modules=(), cuda_graph_impl="local",
                     capacity_factor=1.0)
    (refusal,) = mv.validate([cfg.to_args(MODEL) + run_args()], H100["nodes"] * H100["gpus_per_node"])
    assert refusal and "graphed attention recomputation" in refusal
    assert [v.code for v in check(cfg, MODEL, Cluster(**H100))] == ["recompute_core_attn_in_graphed_attention"]


def test_every_rendered_flag_is_megatrons():
    """Each flag of the TrainingConfig table, the model architecture and the fixed run arguments is
    one Megatron 0.19.2's parser knows (a renamed or misspelt flag fails here)."""
    from moetune.experiment.config import FLAGS
    ours = {f.flag for f in FLAGS}
    for name in LAYOUTS:
        e = load_experiment(name)
        ours |= {a for a in e.baseline.to_args(e.model) + run_args() if a.startswith("--")}
    assert len(ours) > 60
    assert sorted(ours - mv.known_flags()) == []


def test_recompute_inside_graphs_agrees_with_megatron_both_ways():
    """Selective recompute against CUDA graph scopes (Megatron's dropout and router checks): over a
    grid of graph scopes and recompute modules, moetune refuses exactly what Megatron refuses."""
    import itertools
    rows = ("recompute_core_attn_in_graphed_attention", "recompute_mlp_in_graphed_mlp",
            "recompute_moe_with_graphed_router")
    e = load_experiment("qwen3_30b_a3b")
    configs = []
    for impl, scopes, modules in itertools.product(
            ("transformer_engine", "local"), ((), ("attn",), ("attn", "moe_router", "moe_preprocess"), ("moe_router",)),
            (("core_attn",), ("moe",), ("moe_act",), ("layernorm", "core_attn"))):
        if impl == "local" and scopes:
            continue
        configs.append(e.baseline.replace(cuda_graph_impl=impl, cuda_graph_modules=scopes, capacity_factor=1.0,
                                          pad_to_capacity=True, recompute_granularity="selective",
                                          recompute_modules=modules))
    results = mv.validate([c.to_args(e.model) + run_args() for c in configs], e.cluster.gpus)
    ours = [bool({v.code for v in check(c, e.model, e.cluster)} & set(rows)) for c in configs]
    assert sum(ours) >= 10 and sum(not o for o in ours) >= 6
    assert [(c.cuda_graph_modules, c.recompute_modules, r) for c, o, r in zip(configs, ours, results)
            if o != bool(r)] == []


def test_router_refusals_agree_with_megatron():
    """The router rows of the table: Megatron refuses each one too, and accepts the allowed router."""
    from dataclasses import replace
    gpus = H100["nodes"] * H100["gpus_per_node"]
    models = [replace(MODEL, **changes) for changes, _ in MODEL_CASES]
    good = replace(MODEL, moe_router_score_function="sigmoid", moe_router_num_groups=4, moe_router_group_topk=2,
                   moe_router_enable_expert_bias=True, moe_router_topk_scaling_factor=2.5)
    results = mv.validate([OK.to_args(m) + run_args() for m in models + [good]], gpus)
    assert all(results[:-1]), list(zip([c for _, c in MODEL_CASES], results))
    assert results[-1] is None


def test_the_device_te_configs_are_accepted_by_megatron():
    """The trial bank's Transformer Engine configs, as the device ran them (no apex), pass Megatron's
    checks for an image with TE 2.20; without TE, delayed wgrad and MoE FP8 are refused."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "device"))
    import bank_configs
    argvs = [bank_configs.argv(c) for _, c in bank_configs.TE_CONFIGS]
    assert all("--no-gradient-accumulation-fusion" in a for a in argvs)
    assert mv.validate(argvs, 2) == [None] * len(argvs)
    named = dict(zip((n for n, _ in bank_configs.TE_CONFIGS), argvs))
    no_te = mv.validate([named["te_gg_overlap_wgrad"], named["te_gg_fp8"]], 2, has_te=False)
    assert all(no_te), no_te


def test_permute_fusion_is_accepted_with_te_and_refused_without():
    """--moe-permute-fusion needs TE's fused permutation ops: an image with TE passes Megatron's
    check, one without is refused, in one validating process (the stand-in does not leak)."""
    exp = load_experiment("qwen3_30b_a3b_ep4")
    argv = exp.baseline.replace(permute_fusion=True).to_args(exp.model, has_apex=False) + run_args() + ["--no-rope-fusion"]
    with_te, without_te, again = [mv.validate([argv], 4, has_te=te)[0] for te in (True, False, True)]
    assert with_te is None and again is None
    assert without_te and "fused permutation" in without_te


def test_recorded_flags_are_megatrons_parser():
    """experiment/megatron_flags.txt (what `moetune check` reads without the venv) is Megatron's parser."""
    assert mv.recorded_flags() == mv.known_flags()


# megatron-core releases the job's entry runs on; scripts/megatron-venv installs each beside the venv's 0.19
MEGATRON_VERSIONS = ("0.17", "0.18", "0.19")


def _shipped():
    from moetune.experiment.schema import list_experiments
    return [load_experiment(n) for n in list_experiments()]


@pytest.mark.parametrize("version", MEGATRON_VERSIONS)
def test_megatron_version_accepts_rendered_argv_of_shipped_experiments(version):
    """The baseline argv of every shipped experiment (moe_proxy, qwen3_30b_a3b, ...), as rendered for
    that megatron-core, passes that release's own parse_args + validate_args + TransformerConfig."""
    from moetune.experiment.config import args_for_megatron
    exps = _shipped()
    assert {"moe_proxy", "qwen3_30b_a3b"} <= {e.name for e in exps}
    argvs = [args_for_megatron(e.baseline.to_args(e.model) + run_args(), version) for e in exps]
    results = mv.validate(argvs, [e.cluster.gpus for e in exps], mcore=version)
    assert dict(zip((e.name for e in exps), results)) == {e.name: None for e in exps}


@pytest.mark.parametrize("version", MEGATRON_VERSIONS)
def test_megatron_version_knows_every_flag_moetune_renders(version):
    """Every flag of the TrainingConfig table and of the shipped experiments, renamed by
    FLAG_VERSIONS for that release, is one its parser knows; and each FLAG_VERSIONS row holds:
    releases before `since` know only the old name, later ones the new."""
    from moetune.experiment.config import FLAG_VERSIONS, FLAGS, args_for_megatron, megatron_minor
    ours = {f.flag for f in FLAGS}
    for e in _shipped():
        ours |= {a for a in e.baseline.to_args(e.model) + run_args() if a.startswith("--")}
    known = mv.known_flags(version)
    assert sorted(set(args_for_megatron(sorted(ours), version)) - known) == []
    for row in FLAG_VERSIONS:
        assert (row.flag in known) == (megatron_minor(version) >= row.since), row
        assert megatron_minor(version) >= row.since or row.before in known, row


def test_megatron_version_0_17_accepts_a_graphed_config_by_its_old_flag_name():
    """A CUDA-graphed layout: megatron-core 0.17's parser refuses --cuda-graph-modules, and the
    argv renamed by FLAG_VERSIONS passes its full validation."""
    from moetune.experiment.config import args_for_megatron
    e = load_experiment("qwen3_30b_a3b")
    cfg = e.baseline.replace(cuda_graph_impl="transformer_engine", cuda_graph_modules=("attn", "moe_router"))
    argv = cfg.to_args(e.model) + run_args()
    assert "--cuda-graph-modules" in argv
    assert "unrecognized arguments: --cuda-graph-modules" in (mv.parser_refusal(argv, mcore="0.17") or "")
    assert mv.validate([args_for_megatron(argv, "0.17.1")], e.cluster.gpus, mcore="0.17") == [None]
    assert mv.validate([argv], e.cluster.gpus) == [None]


# NVIDIA's Megatron FSDP layout of Qwen3-235B on 256 H100 (docs/prediction.md), and near it
FSDP = dict(tp=1, pp=1, vpp=None, ep=8, etp=1, sequence_parallel=False, account_for_embedding=False,
            account_for_loss=False, micro_batch=4, global_batch=8192, recompute_granularity="full",
            recompute_modules=(), recompute_num_layers=1, fsdp=True)


def test_fsdp_layouts_moetune_renders_pass_megatron():
    """Megatron's validate_args and TransformerConfig take the FSDP layouts moetune renders (with the
    job's environment): NVIDIA's, with PP and VPP, with TP and sequence parallelism, with every
    sharding strategy; moetune's table passes them too. Without the checkpoint format moetune adds,
    Megatron refuses the same argv."""
    e = load_experiment("qwen3_235b")
    nvidia = e.baseline.replace(**FSDP)
    cases = [nvidia, nvidia.replace(pp=2, vpp=47), nvidia.replace(tp=2, sequence_parallel=True),
             *(nvidia.replace(fsdp_sharding=s) for s in ("optim_grads", "optim", "no_shard"))]
    argvs = [c.to_args(e.model) + run_args() for c in cases]
    fmt = argvs[0].index("--ckpt-format")
    no_format = argvs[0][:fmt] + argvs[0][fmt + 2:]
    results = mv.validate(argvs + [no_format], 256)
    assert results[:-1] == [None] * len(cases), results
    assert results[-1] and "fsdp_dtensor" in results[-1], results[-1]
    assert [check(c, e.model, e.cluster) for c in cases] == [[]] * len(cases)


def test_plans_fastest_layouts_of_the_flagships_pass_megatron(no_store):
    """The ten fastest layouts `moetune plan` lists for each flagship (layout strings, CP, ETP,
    DeepEP, EP and TP-comm overlap, CUDA graph scopes among them), and NVIDIA's DeepSeek-V3 PP8 VPP4
    as the search builds it, pass Megatron's validate_args."""
    from moetune.estimate.readings import StoreReadings
    from moetune.estimate.search import search
    from moetune.estimate.space import pipeline_split
    cases = []
    for name in ("qwen3_30b_a3b", "qwen3_235b", "deepseek_v3"):
        e = load_experiment(name)
        cases += [(e, lay.config) for lay in search(e, StoreReadings.empty(), limit=10).layouts]
    ds = load_experiment("deepseek_v3")
    cases.append((ds, ds.baseline.replace(pp=8, vpp=4, **pipeline_split(ds.model, 8, 4))))
    assert any(c.pp_layout for _, c in cases) and any(c.cuda_graph_impl != "none" for _, c in cases)
    results = mv.validate([c.to_args(e.model) + run_args() for e, c in cases], [e.cluster.gpus for e, _ in cases])
    assert [(e.name, r) for (e, _), r in zip(cases, results, strict=True) if r] == []
