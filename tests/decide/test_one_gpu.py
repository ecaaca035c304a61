"""One-GPU studies (tuning.one_gpu, `moetune tune MODEL --one-gpu`): every trial is its layout's
rank 0 alone under Megatron's fake process group, with a short step of the production shapes. Here
the CPU stand-in plays the training (no GPU: the real path, Megatron at qwen3_30b_a3b's and
qwen3_235b's shapes, runs on the GPU machine, benchmarks/device/tune.sh --one-gpu)."""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from moetune import settings
from moetune.decide import rules
from moetune.experiment import fit
from moetune.experiment.config import TrainingConfig
from moetune.store import Store
from moetune.tune import loop as tuner

from tests.conftest import stand_in_experiment


def test_a_one_gpu_step_is_the_same_work_per_rank_whatever_the_micro_batch():
    """The one-GPU config gives each rank the same samples whatever its micro batch, routes statically
    with drop-and-pad, and refuses a micro batch that does not divide them."""
    base = TrainingConfig(tp=2, pp=2, ep=32, micro_batch=1, global_batch=1024, dispatcher="flex",
                          flex_backend="deepep")
    one = fit.one_gpu_config(base, 256, 4)
    assert one.global_batch == 64 * 4  # 64 data-parallel ranks, 4 sequences each
    assert (one.dispatcher, one.capacity_factor, one.pad_to_capacity) == ("alltoall", 1.0, True)
    assert fit.one_gpu_config(base.replace(micro_batch=2), 256, 4).global_batch == one.global_batch
    with pytest.raises(fit.OneGpuError, match="micro batch 8 does not divide the one-GPU step's 4"):
        fit.one_gpu_config(base.replace(micro_batch=8), 256, 4)


def test_a_one_gpu_step_fills_the_pipeline_or_is_refused():
    """The first stage holds as many micro-batches in flight as there are stages, on the cluster;
    a one-GPU step of fewer would measure less memory than the layout needs."""
    c = TrainingConfig(tp=1, pp=4, ep=8, micro_batch=1, global_batch=256)
    assert fit.one_gpu_config(c, 64, 4).global_batch == 16 * 4
    with pytest.raises(fit.OneGpuError, match="2 micro-batches of 2, fewer than the 4 pipeline stages; "
                                              "tuning.one_gpu_samples needs 8 or more"):
        fit.one_gpu_config(c.replace(micro_batch=2), 64, 4)
    assert fit.one_gpu_config(c.replace(micro_batch=2), 64, 8).global_batch == 16 * 8


def test_a_fit_runs_two_micro_batches_a_stage_not_the_production_batch():
    """A fit's global batch is two micro-batches a pipeline stage per data-parallel rank, never more
    than configured."""
    c = TrainingConfig(tp=2, pp=2, ep=32, micro_batch=1, global_batch=1024)
    assert fit.fit_config(c, 256).global_batch == 64 * 1 * 4  # DP 64, 2 micro-batches per stage
    assert fit.fit_config(c).global_batch == 1024  # without the world: as configured
    assert fit.fit_config(c.replace(global_batch=16), 256).global_batch == 16  # never more


def test_rules_that_need_the_collectives_are_marked_in_the_table():
    """Rules that need the real collectives are marked not one_gpu in the table; rules a rank alone can
    show are marked one_gpu."""
    alone = {r.id: r.one_gpu for r in rules.load_rules()}
    for rid in ("dispatcher_deepep", "ep_a2a_overlap", "delay_wgrad", "tp_comm_overlap", "token_drop"):
        assert alone[rid] is False
    for rid in ("cuda_graphs_te", "manual_gc", "fp8_blockwise_hopper", "recompute_moe_act", "raise_ep"):
        assert alone[rid] is True


def test_a_malformed_one_gpu_key_names_the_rule(tmp_path):
    """A one_gpu value that is not a boolean is a RuleError naming the rule and the allowed values."""
    table = settings.rules_file().read_text().replace("    one_gpu: false\n", "    one_gpu: sometimes\n", 1)
    (tmp_path / "rules.yaml").write_text(table)
    with pytest.raises(rules.RuleError, match=r"rule dispatcher_deepep: one_gpu 'sometimes' must be true or false"):
        rules.load_rules(tmp_path / "rules.yaml")


def one_gpu_experiment(tmp_path, **cluster) -> str:
    """8 GPUs' worth of the CPU stand-in (PP 2, EP 2), tuned one GPU at a time."""
    return stand_in_experiment(tmp_path, "one_gpu_stand_in",
                               {"gpus_per_node": 8, "python": sys.executable,
                                "stand_in": {"ms_per_iter": 20}, **cluster},
                               {"budget_trials": 3, "patience": 2, "fit_first": True}, pp=2, ep=2, micro_batch=1,
                               global_batch=64)


@pytest.mark.e2e
def test_a_one_gpu_study_runs_the_slowest_moe_stage_alone_for_every_trial(tmp_path):
    """PP 2 on 8 GPUs' worth of the stand-in, its last stage's rank (4) told to run 3x slower: the
    fit measures ranks 0 and 4, and every trial runs rank 4 alone, profiled; the report and
    `moetune status` say rank 4 stood for the layout, and why."""
    from moetune.report import status, study as report
    store = Store(str(tmp_path / "db.sqlite"))
    exp = one_gpu_experiment(tmp_path, stand_in={"ms_per_iter": 20, "slow_ranks": "4:3"})
    s = tuner.tune(exp, store, executor="local", runs_root=tmp_path / "runs", progress=False, one_gpu=True)
    assert s["study"] == "one_gpu_stand_in-1gpu"
    study = store.study(s["study"])
    trials = store.trials(study.id)
    assert trials and trials[0].state == "completed"
    for t in trials:
        if t.state == "skipped":
            continue
        folder = Path(t.folder)
        fitted = json.loads((folder / "fit" / "fit.json").read_text())  # fitted first, as on the cluster
        assert set(fitted["ranks"]) == {"0", "4"}
        # told 3x slower; a loaded machine slows rank 0 too, so half of that is what is asserted
        assert fitted["ranks"]["4"]["step_time_ms"] > 1.5 * fitted["ranks"]["0"]["step_time_ms"]
        assert fitted["ranks"]["4"]["stage"] == 1 and fitted["ranks"]["4"]["moe_layers"] == 2
        spec = json.loads((folder / "spec.json").read_text())
        assert (spec["nodes"], spec["ntasks_per_node"], spec["fit_ranks"], spec["fit_world"]) == (1, 1, [4], 8)
        bound = json.loads((folder / "one_gpu_rank.json").read_text())
        assert (bound["rank"], bound["stage"]) == (4, 1)
        assert bound["why"].startswith("stage 1 of 2: 2 MoE layers, slowest measured stage, ")
        argv = shlex.split((folder / "command.txt").read_text())
        assert "--fake-process-group" in argv
        # 8 ranks at PP 2: 4 data-parallel ranks, 4 sequences each; the trial's own config keeps 64
        assert argv[argv.index("--global-batch-size") + 1] == "16"
        assert TrainingConfig.from_dict(t.config).global_batch == 64
        # the job's log has the rank's lines (tee'd as they come, for the hang watch)
        assert "[Rank 4]" in (folder / "log.txt").read_text()
    # the GPU hours of a one-GPU study are one GPU's
    its = json.loads((Path(trials[0].folder) / "analysis.json").read_text())["log"]["iteration_ms"]
    assert min(its) > 50  # rank 4's iterations, 3 x 20 ms
    # its whole job on one GPU (start-up included: more than its iterations), and its fit's
    m = store.metrics(trials[0].id)
    assert m["job_gpu_hours"] == pytest.approx(m["job_seconds"] / 3600, rel=1e-6)
    assert m["job_seconds"] > sum(its) / 1e3
    assert m["gpu_hours"] == pytest.approx(m["job_gpu_hours"] + m["fit_gpu_hours"], rel=1e-6)
    assert m["fit_gpu_hours"] > 0
    applied = [d.rule for d in store.decisions(study.id) if d.kind == "apply"]
    by_id = {r.id: r for r in rules.load_rules()}
    assert all(by_id[r].one_gpu for r in applied)
    text = report.study_markdown(store, s["study"])
    ran = [t.number for t in trials if t.state != "skipped"]
    said = ("trial " if len(ran) == 1 else "trials ") + ", ".join(map(str, ran))
    assert f"The rank that stood for the layout: {said}: rank 4 (stage 1 of 2: 2 MoE layers, slowest " \
           "measured stage, " in text
    assert f"one GPU, {said}: rank 4 stood for the layout (stage 1 of 2: " in status.render(store, s["study"])


@pytest.mark.e2e
def test_a_one_gpu_study_never_proposes_what_one_rank_cannot_show(tmp_path):
    """An analysis whose wall is exposed all-to-all: the cluster's study proposes the dispatcher and
    overlap rules; the one-GPU study of the same experiment proposes none of them."""
    from moetune.experiment.schema import load_experiment
    analysis = {"wall": "communication", "confidence": 1.0, "gpu_memory_gb": 80,
                "evidence": [{"wall": "communication", "strength": 1.0}],
                "metrics": {"combined": {"exposed_a2a_share": 0.4, "exposed_a2a_share_net": 0.35,
                                         "exposed_comm_share": 0.45, "gpu_idle_share": 0.05,
                                         "step_time_ms": 1000.0, "peak_memory_gb": 40.0}}}
    exp = load_experiment("qwen3_30b_a3b")
    config = exp.baseline
    props = rules.proposals(analysis, config, exp.model, exp.cluster, exp.tuning)
    cluster_ids = {p.rule.id for p in props}
    assert cluster_ids & {"dispatcher_deepep", "ep_a2a_overlap", "dispatcher_hybridep_nvl"}
    store = Store(str(tmp_path / "db.sqlite"))
    exp.tuning = exp.tuning.model_copy(update={"one_gpu": True})
    t = tuner.Tuner(exp, store, executor="local", runs_root=tmp_path / "runs", study_name="x", progress=False)
    kept = {p.rule.id for p in t._measurable(props)}
    assert kept == cluster_ids & {r.id for r in rules.load_rules() if r.one_gpu}
    assert not kept & {"dispatcher_deepep", "ep_a2a_overlap", "dispatcher_hybridep_nvl", "delay_wgrad"}


@pytest.mark.e2e
def test_one_gpu_trial_under_nsys_is_profiled_as_the_rank_it_runs(tmp_path, nsys_bin):
    """The trial's rank profiled, though the cluster profiles rank 0 only: rank 4 (the slower
    stage) runs, nsys names the report by RANK (srun's SLURM_PROCID is 0 for every rank of a fit),
    and the export and analysis read it as rank 4's."""
    store = Store(str(tmp_path / "db.sqlite"))
    exp = one_gpu_experiment(tmp_path, nsys=nsys_bin, profile_ranks=[0],
                             stand_in={"ms_per_iter": 20, "slow_ranks": "4:3"})
    s = tuner.tune(exp, store, executor="local", runs_root=tmp_path / "runs", progress=False,
                   one_gpu=True, max_trials=1)
    base = store.trials(store.study(s["study"]).id)[0]
    folder = Path(base.folder)
    assert (folder / "trace_4.sqlite").exists() and not (folder / "trace_0.sqlite").exists()
    analysis = json.loads((folder / "analysis.json").read_text())
    assert analysis["metrics"]["combined"]["step_time_ms"] > 50  # rank 4's 3 x 20 ms
    assert "-o" in (folder / "job.sh").read_text() and "trace_%q{RANK}" in (folder / "job.sh").read_text()


# ---- the study's step, planned before any job (decide/one_gpu.py) ----------------------------
SHIPPED = ("deepseek_v3", "mixtral_8x7b", "mixtral_8x22b", "qwen3_30b_a3b", "qwen3_235b", "qwen3_30b_a3b_ep8")


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_experiment_plans_a_one_gpu_study_its_rules_fit_in(tmp_path, name):
    """On the CPU, no job: the study's stored step holds the baseline's layout and every PP and
    micro batch the one-GPU rules can propose from it (in one change, STEP_CHANGES)."""
    from moetune.decide import one_gpu
    from moetune.experiment.schema import load_experiment
    exp = load_experiment(name)
    exp.tuning = exp.tuning.model_copy(update={"one_gpu": True})
    store = Store(str(tmp_path / "db.sqlite"))
    t = tuner.Tuner(exp, store, executor="local", runs_root=tmp_path / "runs", study_name=f"{name}-1gpu",
                    progress=False)
    samples = store.study(f"{name}-1gpu").experiment["tuning"]["one_gpu_samples"]
    assert samples == t.placement.samples >= fit.ONE_GPU_MIN_SAMPLES
    world = exp.cluster.world
    base = fit.one_gpu_config(exp.baseline, world, samples)  # raises where the step cannot run it
    assert base.global_batch == exp.baseline.data_parallel(world) * samples
    layouts = one_gpu.step_layouts(exp.baseline, exp.model, exp.cluster, exp.tuning, t.rules)
    assert (exp.baseline.pp, exp.baseline.micro_batch) in layouts
    for pp, mb in layouts:
        assert fit.one_gpu_problem(exp.baseline.replace(pp=pp, micro_batch=mb), samples) is None
    assert not store.trials(store.study(f"{name}-1gpu").id)  # planned, nothing run


def test_deepseek_v3s_step_holds_its_16_stages_and_the_next_micro_batch():
    """DeepSeek-V3's baseline is PP 16, micro batch 1, and a host-bound baseline proposes micro
    batch 2: 32 sequences per data-parallel rank, where a fixed 4 could run neither."""
    from moetune.decide import one_gpu
    from moetune.experiment.schema import load_experiment
    exp = load_experiment("deepseek_v3")
    layouts = one_gpu.step_layouts(exp.baseline, exp.model, exp.cluster, exp.tuning, rules.load_rules())
    assert layouts == {(16, 1), (16, 2)}  # 61 layers: PP 32 does not divide them
    assert fit.one_gpu_samples(layouts) == 32
    assert fit.one_gpu_problem(exp.baseline, 4).startswith("the one-GPU step's 4 samples make 4 micro-batches")


def host_bound(peak_gb=20.0) -> dict:
    """An analysis of a host-bound rank with room to spare: larger_micro_batch matches."""
    return {"wall": "host_overhead", "confidence": 1.0, "gpu_memory_gb": 80,
            "evidence": [{"wall": "host_overhead", "strength": 1.0}],
            "metrics": {"combined": {"gpu_idle_share": 0.32, "step_time_ms": 1164.0,
                                     "peak_memory_gb": peak_gb}}}


@pytest.mark.e2e
def test_a_change_the_one_gpu_step_cannot_hold_is_skipped_not_proposed(tmp_path):
    """deepseek_v3's one-GPU study: from micro batch 1, larger_micro_batch (to 2) is proposed;
    from micro batch 2 the next doubling would need 64 samples, so it is skipped with the step's
    reason, and another rule is proposed instead."""
    from moetune.experiment.schema import load_experiment
    from moetune.tune.state import StudyState
    exp = load_experiment("deepseek_v3")
    exp.tuning = exp.tuning.model_copy(update={"one_gpu": True})
    store = Store(str(tmp_path / "db.sqlite"))
    t = tuner.Tuner(exp, store, executor="local", runs_root=tmp_path / "runs", study_name="ds", progress=False)
    assert t.placement.samples == 32
    base = store.add_trial(t.study.id, exp.baseline.to_dict(), exp.baseline.config_hash())
    props = t._measurable(rules.proposals(host_bound(), exp.baseline, exp.model, exp.cluster, exp.tuning))
    assert props[0].rule.id == "larger_micro_batch"
    assert t._propose(StudyState(), base, host_bound(), props)
    parent = store.trials(t.study.id)[-1]  # as if kept
    assert parent.fix == "larger_micro_batch"
    mb2 = TrainingConfig.from_dict(parent.config)
    assert mb2 == exp.baseline.replace(micro_batch=2)
    props = t._measurable(rules.proposals(host_bound(), mb2, exp.model, exp.cluster, exp.tuning))
    assert props[0].rule.id == "larger_micro_batch" and props[0].config.micro_batch == 4
    assert t._propose(StudyState(), parent, host_bound(), props)
    skip = next(d for d in store.decisions(t.study.id) if d.kind == "skip")
    assert skip.rule == "larger_micro_batch"
    assert "one-GPU step cannot hold it" in skip.reason and "fewer than the 16 pipeline stages" in skip.reason
    assert store.trials(t.study.id)[-1].fix not in ("larger_micro_batch", None)


def test_an_explicit_step_that_cannot_run_the_baseline_is_refused_before_any_job(tmp_path):
    """A one-GPU step too small for the baseline's pipeline is refused, naming the file, before any
    study or job."""
    exp_path = one_gpu_experiment(tmp_path)
    text = Path(exp_path).read_text().replace("fit_first: true", "fit_first: true\n  one_gpu_samples: 1")
    Path(exp_path).write_text(text)
    store = Store(str(tmp_path / "db.sqlite"))
    with pytest.raises(tuner.TunerError, match=r"one_gpu_stand_in.yaml: the baseline: the one-GPU step's 1 "
                                               r"samples make 1 micro-batches of 1, fewer than the 2 pipeline"):
        tuner.tune(exp_path, store, executor="local", runs_root=tmp_path / "runs", progress=False, one_gpu=True)
    assert not store.studies()


@pytest.mark.e2e
def test_a_changed_step_or_layout_starts_a_study_of_its_own_and_says_so(tmp_path, capsys):
    """The step is stored once per study: an experiment whose step or baseline changed gets its own
    study (its trials would not compare), and the tuner says which; the same plan resumes it."""
    from moetune.experiment.schema import load_experiment
    exp_path = one_gpu_experiment(tmp_path)
    store = Store(str(tmp_path / "db.sqlite"))

    def tuner_of(**tuning):
        exp = load_experiment(exp_path)
        exp.tuning = exp.tuning.model_copy(update={"one_gpu": True, **tuning})
        return tuner.Tuner(exp, store, executor="local", runs_root=tmp_path / "runs",
                           study_name="s-1gpu", progress=True)
    first = tuner_of()
    assert first.study_name == "s-1gpu" and first.placement.samples == 4
    assert tuner_of().study_name == "s-1gpu"  # same plan: the same study
    capsys.readouterr()
    other = tuner_of(one_gpu_samples=8)
    assert other.study_name.startswith("s-1gpu-") and other.placement.samples == 8
    err = capsys.readouterr().err
    assert "study s-1gpu was planned otherwise (one_gpu_samples 4 -> 8)" in err and other.study_name in err
    assert store.study(other.study_name).experiment["tuning"]["one_gpu_samples"] == 8
    assert store.study("s-1gpu").experiment["tuning"]["one_gpu_samples"] == 4
    assert tuner_of(one_gpu_samples=8).study_name == other.study_name  # and resumes it


@pytest.mark.e2e
def test_trials_of_one_layout_run_the_rank_their_first_trial_ran(tmp_path):
    """A fit of three iterations can rank two close stages either way from one trial to the next
    (mixtral_8x22b on the H100: stage 7 first, stage 0 after CUDA graphs): a child of the same
    pipeline layout runs its parent's rank whatever its own fit says, and a child that changes
    the pipeline is bounded by its own fit."""
    from moetune.job.paths import TrialPaths
    from moetune.experiment.schema import load_experiment
    from moetune.trial import stages
    store = Store(str(tmp_path / "db.sqlite"))
    path = one_gpu_experiment(tmp_path)
    exp = load_experiment(path)
    study = store.create_study("pin-1gpu", exp.name, {"experiment": path, "tuning": {"one_gpu": True}})
    base = exp.baseline
    parent = store.add_trial(study.id, base.to_dict(), base.config_hash())
    child_cfg = base.replace(micro_batch=2)
    child = store.add_trial(study.id, child_cfg.to_dict(), child_cfg.config_hash(), parent_id=parent.id, fix="x")
    moved_cfg = base.replace(pp=1, ep=4)
    moved = store.add_trial(study.id, moved_cfg.to_dict(), moved_cfg.config_hash(), parent_id=parent.id, fix="y")
    for t in (parent, child, moved):
        store.update_trial(t.id, folder=str(tmp_path / "runs" / str(t.id)))
    pp = TrialPaths(tmp_path / "runs" / str(parent.id))
    pp.folder.mkdir(parents=True)
    pp.one_gpu_rank.write_text(json.dumps({"rank": 4, "stage": 1, "why": "stage 1 of 2: chosen by trial 1's fit"}))
    cp = TrialPaths(tmp_path / "runs" / str(child.id))
    cp.fit.folder.mkdir(parents=True)
    # the child's own fit finds stage 0 slower
    cp.fit.fit_result.write_text(json.dumps({"ranks": {"0": {"step_time_ms": 90.0}, "4": {"step_time_ms": 60.0}}}))
    ctx = stages.TrialContext(store, child.id, tmp_path / "runs")
    bound = stages.one_gpu_rank(ctx)
    assert (bound.rank, bound.stage) == (4, 1) and "trial 1's fit" in bound.why
    assert fit.bound_rank(exp.model, child_cfg, 8, {"0": {"step_time_ms": 90.0}, "4": {"step_time_ms": 60.0}}).rank == 0
    other = stages.one_gpu_rank(stages.TrialContext(store, moved.id, tmp_path / "runs"))
    assert other.rank == 0 and other.why == "the layout has one pipeline stage"
