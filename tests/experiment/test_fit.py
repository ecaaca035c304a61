"""Fit first (experiment/fit.py, the fit stage, the tuner): which ranks bound a layout's memory, the fit job
run for real with the CPU stand-in (no GPU here: the real path runs Megatron's fake process group on
the GPU machine, benchmarks/device/fit.sh), and a layout that does not fit never reaching the
cluster; and the verdicts of real fit logs recorded on an H100 (a graphed layout's graph pools
counted, a refusal named)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from moetune.analysis.logs import parse_log
from moetune.decide import rules
from moetune.experiment import fit
from moetune.experiment.config import TrainingConfig
from moetune.experiment.gpus import GPUS
from moetune.store import Store
from moetune.tune import loop as tuner
from moetune.trial import stages

from tests.conftest import stand_in_experiment


def test_bounding_ranks_are_the_first_and_last_pipeline_stage():
    """The ranks a fit measures are the first rank of the first and of the last pipeline stage."""
    assert fit.bounding_ranks(TrainingConfig(tp=2, pp=1, ep=32), 256) == (0,)
    # tp-cp-ep-dp-pp order: a stage is 256/2 ranks, the last one starts at 128
    assert fit.bounding_ranks(TrainingConfig(tp=2, pp=2, ep=32), 256) == (0, 128)
    assert fit.bounding_ranks(TrainingConfig(tp=2, pp=16, ep=64), 1024) == (0, 960)


NEAR_CAPACITY = Path(__file__).resolve().parents[1] / "data" / "gpu" / "near_capacity"  # the H100 run's fit logs
SHIPPED = ("deepseek_v3", "mixtral_8x7b", "mixtral_8x22b", "qwen3_30b_a3b", "qwen3_235b", "qwen3_30b_a3b_ep8")


def shipped(name):
    from moetune.experiment.schema import load_experiment
    exp = load_experiment(name)
    return exp.model, exp.baseline, exp.cluster.world


@pytest.mark.parametrize("name", SHIPPED)
def test_the_fit_measures_the_first_last_and_heaviest_moe_stage_of_every_shipped_layout(name):
    """Each shipped layout's stages hold all its layers (MTP on the last), and the fit measures its
    first and last stage and the one with the most MoE layers and micro-batches in flight."""
    model, config, world = shipped(name)
    stages = fit.pipeline_stages(model, config)
    assert len(stages) == config.pp
    assert sum(s.layers for s in stages) == model.num_layers + model.mtp_num_layers
    assert sum(s.moe_layers for s in stages) == model.moe_layers + model.mtp_num_layers
    assert [s.in_flight for s in stages] == list(range(config.pp, 0, -1))
    heavy = fit.heaviest_moe_stage(stages)
    ranks = fit.bounding_ranks(config, world, model)
    block = world // config.pp
    expect = sorted({0, config.pp - 1, heavy.index}) if config.pp > 1 else [0]
    assert sorted(r // block for r in ranks) == expect and all(r % block == 0 for r in ranks)


def test_deepseek_v3s_fit_measures_its_first_moe_stage_beside_the_dense_first_one():
    """61 layers on 16 stages: 3 dense on the first (--decoder-first-pipeline-num-layers 3), 4 MoE
    on each middle one, 2 and the MTP layer on the last. Stage 1 (rank 64 of 1024) holds the most
    MoE layers and, of those, the most micro-batches in flight."""
    model, config, world = shipped("deepseek_v3")
    stages = fit.pipeline_stages(model, config)
    assert [(s.layers, s.moe_layers) for s in stages] == [(3, 0)] + [(4, 4)] * 14 + [(3, 3)]
    assert fit.heaviest_moe_stage(stages).index == 1
    assert fit.bounding_ranks(config, world, model) == (0, 64, 960)
    assert fit.bounding_ranks(config, world) == (0, 960)  # without the model: first and last


def test_deepseek_v3s_one_gpu_rank_is_the_slowest_measured_moe_stage():
    """Never the dense first stage, however slow; the slowest measured stage of those with MoE
    layers; measured within STEP_TIE_SHARE of each other, the one with more MoE layers and more in
    flight; with no fit, the heaviest MoE stage."""
    model, config, world = shipped("deepseek_v3")
    timed = lambda **ms: {int(r[1:]): {"step_time_ms": v} for r, v in ms.items()}
    b = fit.bound_rank(model, config, world, timed(r0=2000.0, r64=3100.0, r960=4340.0))
    assert (b.rank, b.stage) == (960, 15)
    assert b.why == ("stage 15 of 16: 3 MoE layers, slowest measured stage, 4.34 s per step against "
                     "2.00 s for stage 0, 3.10 s for stage 1 (stage 0 holds no MoE layer)")
    assert fit.bound_rank(model, config, world, timed(r0=9000.0, r64=3100.0, r960=2000.0)).rank == 64
    tie = fit.bound_rank(model, config, world, timed(r0=2000.0, r64=4200.0, r960=4340.0))
    assert tie.rank == 64 and "stage 1 of 16: 4 MoE layers, within 5% of the slowest measured stage" in tie.why
    # fit.json's ranks are strings; a rank that did not measure is passed over
    fitted = {"0": {"step_time_ms": 2000.0}, "64": {"step_time_ms": None}, "960": {"step_time_ms": 4340.0}}
    assert fit.bound_rank(model, config, world, fitted).rank == 960
    alone = fit.bound_rank(model, config, world)
    assert (alone.rank, alone.stage) == (64, 1) and "no fit measured its step" in alone.why
    assert fit.bound_rank(model, config.replace(pp=1, first_pp_layers=None, last_pp_layers=None), world).rank == 0


def test_interleaved_stages_hold_the_dense_layers_in_their_first_chunks():
    """8 layers, 3 dense first, PP 2 x VPP 2 (2 layers a chunk): stage 0 builds layers 0-1 and
    4-5, stage 1 layers 2-3 and 6-7, so stage 1 holds 3 MoE layers and stage 0 two."""
    from moetune.experiment.model import ModelArch
    model, _, _ = shipped("deepseek_v3")
    small = ModelArch.from_dict({**model.to_dict(), "num_layers": 8, "mtp_num_layers": 0})
    stages = fit.pipeline_stages(small, TrainingConfig(pp=2, vpp=2))
    assert [(s.layers, s.moe_layers) for s in stages] == [(4, 2), (4, 3)]
    assert fit.bounding_ranks(TrainingConfig(pp=2, vpp=2), 16, small) == (0, 8)


def test_fit_config_routes_statically_on_the_alltoall_dispatcher():
    """A fit runs the alltoall dispatcher with drop-and-pad at capacity 1 and its own few iterations,
    keeping the layout."""
    c = fit.fit_config(TrainingConfig(ep=8, dispatcher="flex", flex_backend="deepep", train_iters=50))
    assert (c.dispatcher, c.flex_backend, c.capacity_factor, c.pad_to_capacity) == ("alltoall", None, 1.0, True)
    assert c.train_iters == fit.FIT_ITERS >= 3 and c.ep == 8
    args = c.to_args()
    assert "--moe-expert-capacity-factor" in args and "--moe-pad-expert-input-to-capacity" in args


@pytest.mark.parametrize("ranks, capacity, fits, words", [
    ({0: {"max_allocated_gb": 60.0, "max_reserved_gb": 62.0}}, 80.0, True, "rank 0 peaks at 62.0 GB"),
    ({0: {"max_allocated_gb": 60.0, "max_reserved_gb": 62.0},
      8: {"max_allocated_gb": 74.0, "max_reserved_gb": 75.0}}, 80.0, False, "rank 8 peaks at 75.0 GB"),
    ({0: {"max_allocated_gb": None, "failure": "oom"}}, 141.0, False, "rank 0 ran out of memory"),
    ({0: {"max_allocated_gb": None, "failure": None}}, 141.0, False, "rank 0 did not measure"),
])
def test_verdict_counts_the_headroom(ranks, capacity, fits, words):
    """The fit verdict measures peak memory against capacity less the headroom (NCCL buffers plus a
    routing-imbalance share)."""
    v = fit.verdict(ranks, capacity)
    assert v.fits is fits and words in v.reason
    assert v.headroom_gb == pytest.approx(fit.NCCL_BUFFERS_GB + fit.ROUTING_IMBALANCE_SHARE * capacity)
    # the trial's figures: out of memory is said (plan drops the layout), a rank that did not
    # measure is not taken for it
    figures = fit.fit_metrics(v.to_dict())
    assert figures.get("fit_oom") == (1.0 if "out of memory" in words else None)
    assert figures["fit_fits"] == float(fits) and figures.get("fit_peak_gb") == v.peak_gb


def fit_experiment(tmp_path, **cluster) -> str:
    """8 GPUs' worth of the CPU stand-in, PP 2 and EP 2, fitted first."""
    return stand_in_experiment(tmp_path, "fit_stand_in", {"gpus_per_node": 8, "python": sys.executable,
                                                          "stand_in": {"ms_per_iter": 20}, **cluster},
                               {"budget_trials": 2, "patience": 1, "fit_first": True}, pp=2, ep=2)


@pytest.mark.e2e
def test_a_layout_that_fits_is_measured_then_submitted(tmp_path):
    """A study's baseline is fitted first (each bounding rank run alone), kept with the fit as evidence,
    then rendered and run."""
    store = Store(str(tmp_path / "db.sqlite"))
    s = tuner.tune(fit_experiment(tmp_path), store, executor="local", runs_root=tmp_path / "runs",
                   progress=False)
    study = store.study(s["study"])
    base = store.trials(study.id)[0]
    assert [r.stage for r in store.stage_runs(base.id)][:2] == ["fit", "render"]
    folder = Path(base.folder)
    fitted = json.loads((folder / "fit" / "fit.json").read_text())
    assert fitted["fits"] and fitted["world"] == 8 and sorted(fitted["ranks"]) == ["0", "4"]
    # each rank ran alone, as the rank it stands for
    assert "[Rank 4]" in (folder / "fit" / "log_rank_4.txt").read_text()
    assert "[Rank 0]" in (folder / "fit" / "log_rank_0.txt").read_text()
    keep = next(d for d in store.decisions(study.id) if d.trial_id == base.id and d.kind == "keep")
    assert keep.evidence["fit"]["fits"] is True and "rank" in keep.evidence["fit"]["reason"]
    assert store.metrics(base.id)["fit_compute_ms"] == pytest.approx(20, rel=0.5)


@pytest.mark.e2e
def test_a_layout_that_does_not_fit_never_reaches_the_cluster(tmp_path):
    """2 GB of GPU: the headroom alone (NCCL buffers, uneven routing) is more, so neither the
    baseline nor any memory fix fits; each is measured on one GPU, none is rendered for the cluster,
    and the study stops when the table has no memory fix left."""
    store = Store(str(tmp_path / "db.sqlite"))
    s = tuner.tune(fit_experiment(tmp_path, gpu_memory_gb=2), store, executor="local",
                   runs_root=tmp_path / "runs", progress=False)
    study = store.study(s["study"])
    trials = store.trials(study.id)
    assert len(trials) > 2 and {t.state for t in trials} == {"no_fit"}
    for t in trials:
        assert [r.stage for r in store.stage_runs(t.id)] == ["fit"]  # never rendered nor submitted
        assert not (Path(stages.TrialContext(store, t.id, tmp_path / "runs").folder) / "job.sh").exists()
    first = next(d for d in store.decisions(study.id) if d.trial_id == trials[0].id)
    assert first.kind == "unfit" and "exceeds the GPU's 2 GB" in first.reason
    assert first.evidence["fit"]["fits"] is False
    fixes = [t.fix for t in trials[1:]]
    order = [rid for rid in rules.load_fit_order() if rid in fixes]
    assert fixes == order  # the guidance's order (none frees memory here: each on the baseline)
    assert "no memory fix left to try" in s["stop_reason"]


def test_moetune_fit_by_hand(tmp_path, capsys):
    """`moetune fit` measures the bounding ranks of a PP 4 layout and, run again, measures the same
    trial anew."""
    from moetune.cli.main import main
    exp = fit_experiment(tmp_path)
    argv = ["--db", str(tmp_path / "db.sqlite"), "fit", exp, "--pp", "4", "--executor", "local",
            "--runs", str(tmp_path / "runs")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "on 8 GPUs: rank" in out and f"fits the GPU's {GPUS['H100'].memory_gb:g} GB" in out
    assert [ln.split()[0] for ln in out.splitlines()[2:]] == ["0", "6"]  # pp=4: the last stage starts at 6
    assert main(argv) == 0  # again: the same trial, measured anew
    store = Store(str(tmp_path / "db.sqlite"))
    assert len(store.trials(store.study("fit_stand_in-fit").id)) == 1


@pytest.mark.e2e
def test_the_report_shows_the_fit_and_the_compute_floor(tmp_path):
    """The study report shows the fit verdict and the rank's compute measured alone."""
    from moetune.report.study import study_markdown
    store = Store(str(tmp_path / "db.sqlite"))
    s = tuner.tune(fit_experiment(tmp_path), store, executor="local", runs_root=tmp_path / "runs",
                   progress=False)
    text = study_markdown(store, s["study"])
    assert "Fit on one GPU first: rank" in text and "fits the GPU" in text
    assert "ms is this rank's compute measured alone on one GPU" in text


def tune_ep2_on_10gb(tmp_path, **stand_in):
    """The stand-in's EP 2 baseline, 16 GB of model, on a 10 GB GPU, without the distributed
    optimizer; one trial's budget."""
    exp = yaml.safe_load(Path(fit_experiment(tmp_path, gpu_memory_gb=10, stand_in={
        "ms_per_iter": 20, "model_mb": 16000, **stand_in})).read_text())
    exp["tuning"]["budget_trials"] = 1
    exp["baseline"].update(tp=1, pp=1, ep=2, micro_batch=1, distributed_optimizer=False)
    path = tmp_path / "fit_stand_in.yaml"
    path.write_text(yaml.safe_dump(exp))
    store = Store(str(tmp_path / "db.sqlite"))
    return store, tuner.tune(str(path), store, executor="local", runs_root=tmp_path / "runs", progress=False)


@pytest.mark.e2e
def test_memory_fixes_are_fitted_in_the_guidance_order_until_one_fits(tmp_path):
    """The baseline (EP 2) does not fit a 10 GB GPU: the distributed optimizer (first in the table's
    fit_order) leaves the stand-in's memory as it was, so it does not fit either, and, having freed
    nothing, is not built on; raising EP on the baseline halves the rank's share of the model and
    fits; only that layout reaches the cluster, and it is kept as the first layout that fits."""
    store, s = tune_ep2_on_10gb(tmp_path)
    study = store.study(s["study"])
    trials = store.trials(study.id)
    assert [(t.fix, t.state) for t in trials] == [(None, "no_fit"), ("distributed_optimizer", "no_fit"),
                                                  ("raise_ep", "completed")]
    kinds = [(d.kind, d.rule) for d in store.decisions(study.id) if d.trial_id]
    assert kinds == [("unfit", None), ("apply", "distributed_optimizer"), ("unfit", "distributed_optimizer"),
                     ("apply", "raise_ep"), ("keep", "raise_ep")]
    assert [r.stage for r in store.stage_runs(trials[1].id)] == ["fit"]  # never submitted
    cfg = TrainingConfig.from_dict(trials[2].config)
    assert (cfg.ep, cfg.distributed_optimizer) == (4, False)
    assert trials[2].parent_id == trials[0].id  # not on the fix that freed nothing
    assert s["best_trial"] == 3 and "trial budget spent (1 of 1)" in s["stop_reason"]


@pytest.mark.e2e
def test_a_memory_fix_that_lowers_the_peak_is_built_on(tmp_path):
    """40 GB of model on a 10 GB GPU: EP 4 halves the baseline's peak and still does not fit, so
    the next fixes go on top of it (the distributed optimizer again, freeing nothing there either,
    then EP 8, which fits)."""
    store, s = tune_ep2_on_10gb(tmp_path, model_mb=40000)
    trials = store.trials(store.study(s["study"]).id)
    peaks = [store.metrics(t.id).get("fit_peak_gb") for t in trials]
    assert [t.fix for t in trials] == [None, "distributed_optimizer", "raise_ep", "distributed_optimizer",
                                       "raise_ep"]
    assert [t.parent_id for t in trials[1:]] == [trials[0].id, trials[0].id, trials[2].id, trials[2].id]
    assert peaks[2] < 0.6 * peaks[0] and peaks[4] < 0.6 * peaks[2]
    assert TrainingConfig.from_dict(trials[-1].config).ep == 8 and trials[-1].state == "completed"


@pytest.mark.e2e
def test_a_memory_fix_refused_at_start_up_is_passed_over(tmp_path):
    """As on the device (a graphed layout's fit with core_attn recompute stopped at Megatron's
    TransformerConfig check): the stand-in refuses the distributed optimizer at start-up, so that
    fix's fit measures nothing; the report names the refusal, and the next memory fix builds on the
    last fit that measured (the baseline), not on the refused config."""
    store, s = tune_ep2_on_10gb(tmp_path, refuse="--use-distributed-optimizer")
    trials = store.trials(store.study(s["study"]).id)
    assert [(t.fix, t.state) for t in trials] == [(None, "no_fit"), ("distributed_optimizer", "no_fit"),
                                                  ("raise_ep", "completed")]
    refused = next(d for d in store.decisions(store.study(s["study"]).id)
                   if d.trial_id == trials[1].id and d.kind == "unfit")
    assert "AssertionError: the stand-in refuses --use-distributed-optimizer" in refused.reason
    assert refused.evidence["fit"]["failure"] == "python_error"
    assert trials[2].parent_id == trials[0].id  # on the baseline, which measured
    cfg = TrainingConfig.from_dict(trials[2].config)
    assert (cfg.ep, cfg.distributed_optimizer) == (4, False)


@pytest.mark.e2e
def test_a_baseline_megatron_refuses_stops_the_study_saying_why(tmp_path):
    """A baseline refused at start-up ends as no_fit and stops the study with the refusal in the reason."""
    exp = yaml.safe_load(Path(fit_experiment(tmp_path, stand_in={
        "ms_per_iter": 20, "refuse": "--use-distributed-optimizer"})).read_text())
    exp["baseline"]["distributed_optimizer"] = True
    path = tmp_path / "fit_stand_in.yaml"
    path.write_text(yaml.safe_dump(exp))
    store = Store(str(tmp_path / "db.sqlite"))
    s = tuner.tune(str(path), store, executor="local", runs_root=tmp_path / "runs", progress=False)
    assert [t.state for t in store.trials(store.study(s["study"]).id)] == ["no_fit"]
    assert s["stop_reason"] == ("baseline trial did not complete (fit: rank 0 did not measure (AssertionError: "
                                "the stand-in refuses --use-distributed-optimizer (as Megatron refuses a config "
                                "at start-up))); fix the baseline first")


@pytest.mark.slurm
def test_the_fit_stage_through_the_real_slurm(slurm, make_trial):
    """A 2-node x 2-task layout with PP 2 is fitted as one job of one task on one node, its two
    bounding ranks (0 and 2) one after another, each told the world of 4 it stands in."""
    from moetune.job import scheduler as jobs
    from tests.conftest import stand_in_cluster
    store, tid = make_trial(cluster=stand_in_cluster(nodes=2, ntasks_per_node=2, gpu_type="H100"), pp=2)
    out = stages.run_stage(store, tid, stages.FIT)
    fitted = json.loads(Path(out[0]).read_text())
    assert fitted["fits"] and fitted["world"] == 4 and sorted(fitted["ranks"]) == ["0", "2"]
    assert fitted["job"]["state"] == "COMPLETED"
    st = jobs.slurm_state(fitted["job"]["job_id"])  # Slurm's own word, through sacct
    assert st.state == "COMPLETED" and "," not in st.node and "[" not in st.node  # one node
    folder = Path(out[0]).parent
    sbatch = (folder / "job.sbatch").read_text()
    assert "#SBATCH --nodes=1" in sbatch and "#SBATCH --ntasks-per-node=1" in sbatch
    assert "[Rank 2]" in (folder / "log_rank_2.txt").read_text()
    assert [r.stage for r in store.stage_runs(tid)] == ["fit"]


def test_a_graphed_fit_counts_the_graph_pools():
    """qwen3_30b_a3b's one-GPU layout with TE graphs, fitted for 5 iterations: the capture after
    iteration 3 takes GBs that Megatron's max allocated never shows; its end-of-run report holds
    them as reserved memory, and the verdict reads the larger."""
    p = parse_log(NEAR_CAPACITY / "fit_graphed.log.xz")
    assert p["iterations"] == fit.CUDA_GRAPH_WARMUP_STEPS + 2 and p["failure"] is None
    assert p["max_allocated_gb"] == pytest.approx(65.578, abs=1e-3)
    assert p["max_reserved_gb"] == pytest.approx(74.184, abs=1e-3)  # after iteration 5: graph pools
    v = fit.verdict({0: p}, 80.0)
    assert v.peak_gb == pytest.approx(74.184, abs=1e-3) and not v.fits and v.failure is None


def test_a_fit_megatron_refused_names_the_refusal():
    """A fit log that ends in Megatron's own assertion is a python_error whose verdict names the
    refusal (recorded on the H100 beside the near-capacity run)."""
    p = parse_log(NEAR_CAPACITY / "fit_python_error.log.xz")
    assert p["failure"] == "python_error" and p["iterations"] == 0
    assert p["failure_line"] == "AssertionError: attention dropout is not supported with graphed attention recomputation."
    v = fit.verdict({0: p}, 80.0)
    assert not v.fits and v.failure == "python_error" and "attention dropout" in v.reason


def test_pipeline_stages_count_dense_layers_wherever_they_are():
    """A pattern with dense layers 1 and 6 of 8 on PP2: each stage holds one dense layer, three
    MoE ones."""
    from moetune.experiment.model import ModelArch
    m = ModelArch("p", 8, 256, 4, 4, 512, 128, 4, 2, 1000, 64, moe_layer_pattern=(1, 0, 1, 1, 1, 1, 0, 1))
    stages = fit.pipeline_stages(m, TrainingConfig(pp=2))
    assert [(s.layers, s.moe_layers) for s in stages] == [(4, 3), (4, 3)]
