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

from moetune.pipeline.decide import rules
from moetune.pipeline.spec import fit
from moetune.pipeline.spec.config import TrainingConfig
from moetune.pipeline.store import Store
from moetune.pipeline.tune import loop as tuner

from tests.conftest import stand_in_experiment


def test_a_one_gpu_step_is_the_same_work_per_rank_whatever_the_micro_batch():
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
    c = TrainingConfig(tp=2, pp=2, ep=32, micro_batch=1, global_batch=1024)
    assert fit.fit_config(c, 256).global_batch == 64 * 1 * 4  # DP 64, 2 micro-batches per stage
    assert fit.fit_config(c).global_batch == 1024  # without the world: as configured
    assert fit.fit_config(c.replace(global_batch=16), 256).global_batch == 16  # never more


def test_rules_that_need_the_collectives_are_marked_in_the_table():
    alone = {r.id: r.one_gpu for r in rules.load_rules()}
    for rid in ("dispatcher_deepep", "ep_a2a_overlap", "delay_wgrad", "tp_comm_overlap", "token_drop"):
        assert alone[rid] is False
    for rid in ("cuda_graphs_te", "manual_gc", "fp8_blockwise_hopper", "recompute_moe_act", "raise_ep"):
        assert alone[rid] is True


def test_a_malformed_one_gpu_key_names_the_rule(tmp_path):
    table = Path(rules.RULES_FILE).read_text().replace("    one_gpu: false\n", "    one_gpu: sometimes\n", 1)
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


def test_a_one_gpu_study_runs_rank_0_alone_for_every_trial(tmp_path):
    store = Store(str(tmp_path / "db.sqlite"))
    s = tuner.tune(one_gpu_experiment(tmp_path), store, executor="local", runs_root=tmp_path / "runs",
                   progress=False, one_gpu=True)
    assert s["study"] == "one_gpu_stand_in-1gpu"
    study = store.study(s["study"])
    trials = store.trials(study.id)
    assert trials and trials[0].state == "completed"
    for t in trials:
        if t.state == "skipped":
            continue
        folder = Path(t.folder)
        spec = json.loads((folder / "spec.json").read_text())
        assert (spec["nodes"], spec["ntasks_per_node"], spec["fit_ranks"], spec["fit_world"]) == (1, 1, [0], 8)
        argv = shlex.split((folder / "command.txt").read_text())
        assert "--fake-process-group" in argv
        # 8 ranks at PP 2: 4 data-parallel ranks, 4 sequences each; the trial's own config keeps 64
        assert argv[argv.index("--global-batch-size") + 1] == "16"
        assert TrainingConfig.from_dict(t.config).global_batch == 64
        # the job's log has the rank's iteration lines (tee'd as they come, for the hang watch)
        assert "[Rank 0]" in (folder / "log.txt").read_text()
        assert (folder / "fit" / "fit.json").exists()  # fitted first, as on the cluster
    # the GPU hours of a one-GPU study are one GPU's
    its = json.loads((Path(trials[0].folder) / "analysis.json").read_text())["log"]["iteration_ms"]
    assert store.metrics(trials[0].id)["gpu_hours"] == pytest.approx(sum(its) / 3.6e6, rel=1e-6)
    applied = [d.rule for d in store.decisions(study.id) if d.kind == "apply"]
    by_id = {r.id: r for r in rules.load_rules()}
    assert all(by_id[r].one_gpu for r in applied)


def test_a_one_gpu_study_never_proposes_what_one_rank_cannot_show(tmp_path):
    """An analysis whose wall is exposed all-to-all: the cluster's study proposes the dispatcher and
    overlap rules; the one-GPU study of the same experiment proposes none of them."""
    from moetune.pipeline.spec.experiment import load_experiment
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


def test_one_gpu_trial_under_nsys_is_profiled_as_rank_0(tmp_path, nsys_bin):
    """The fit job profiled: nsys names the report by RANK (srun's SLURM_PROCID is 0 for every rank
    of a fit), and the export and analysis read it as rank 0's."""
    store = Store(str(tmp_path / "db.sqlite"))
    exp = one_gpu_experiment(tmp_path, nsys=nsys_bin, profile_ranks=[0])
    s = tuner.tune(exp, store, executor="local", runs_root=tmp_path / "runs", progress=False,
                   one_gpu=True, max_trials=1)
    base = store.trials(store.study(s["study"]).id)[0]
    folder = Path(base.folder)
    assert (folder / "trace_0.sqlite").exists()
    analysis = json.loads((folder / "analysis.json").read_text())
    assert analysis["metrics"]["combined"]["step_time_ms"] > 0
    assert "-o" in (folder / "job.sh").read_text() and "trace_%q{RANK}" in (folder / "job.sh").read_text()
