"""The one-GPU tuning runs recorded on the device (one H100, 2026-11-23; benchmarks/one_gpu_tuning/,
docs/benchmarks.md "One-GPU tuning at production shapes"): their fit logs give their recorded
verdicts again, the graphed layout whose 3-iteration fit missed the CUDA graphs' pools, and the demo
replaying the qwen3_30b_a3b study from the trial bank."""
from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest

from moetune.analysis.logs import parse_log
from moetune.job import replay
from moetune.experiment import fit
from moetune.experiment.config import TrainingConfig
from moetune.store import Store
from moetune.trial.stages import _fit_rank
from moetune.tune import loop as tuner

RUN = Path(__file__).resolve().parents[2] / "benchmarks" / "one_gpu_tuning"
FITS = sorted(RUN.glob("runs/*/fit/fit.json"), key=lambda p: int(p.parent.parent.name))


def test_the_run_is_there():
    """The recorded device run holds a fit for each of its 11 trials."""
    assert len(FITS) == 11  # every trial of both studies was fitted first


@pytest.mark.parametrize("path", FITS, ids=lambda p: p.parent.parent.name)
def test_each_recorded_fit_verdict_follows_from_its_logs(path):
    """Each recorded fit verdict (fits, peak, reason) is what fit.verdict gives from the ranks' recorded
    logs."""
    recorded = json.loads(path.read_text())
    ranks = {int(r): _fit_rank(path.parent / f"log_rank_{r}.txt.xz") for r in recorded["ranks"]}
    v = fit.verdict(ranks, recorded["capacity_gb"])
    assert (v.fits, v.peak_gb, v.reason) == (recorded["fits"], recorded["peak_gb"], recorded["reason"])


def test_qwen3_235b_fits_an_h100_only_at_ep_128():
    """The baseline (EP 32) ran out of memory alone on the H100; EP 64 peaked at 74.4 GB, which with
    the 7 GB headroom exceeds 80 GB; EP 128 fits, and was the first layout run."""
    store = Store(str(RUN / "moetune.db"))
    study = store.study("qwen3_235b-1gpu")
    trials = store.trials(study.id)
    eps = [TrainingConfig.from_dict(t.config).ep for t in trials[:3]]
    assert eps == [32, 64, 128] and [t.state for t in trials[:3]] == ["no_fit", "no_fit", "completed"]
    first = _fit_rank(RUN / "runs" / str(trials[0].id) / "fit" / "log_rank_0.txt.xz")
    assert first["failure"] == "oom" and first["iterations"] == 1  # after 77 GB at iteration 1


def test_a_graphed_fit_runs_past_the_capture():
    """Trial 4 of qwen3_235b: TE CUDA graphs on the EP-128 layout. Its 3-iteration fit measured
    69.0 GB, as without graphs, and let it run; Megatron captured the graphs after iteration 3 and
    the trial ran out of memory there, 26.8 GB of it in the graphs' private pools. A fit of a graphed
    config now runs past the capture."""
    folder = RUN / "runs" / "9"
    config = TrainingConfig.from_dict(json.loads((folder / "config.json").read_text()))
    assert config.cuda_graph_impl == "transformer_engine"
    fitted = parse_log(folder / "fit" / "log_rank_0.txt.xz")
    assert fitted["iterations"] == 3 and fitted["max_allocated_gb"] == pytest.approx(68.909)
    trial = parse_log(folder / "log.txt.xz")
    assert trial["failure"] == "oom" and trial["iterations"] == fit.CUDA_GRAPH_WARMUP_STEPS
    assert "torch.OutOfMemoryError" in trial["failure_line"]
    text = lzma.open(folder / "log.txt.xz", "rt").read()
    assert "26.81 GiB allocated in private pools (e.g., CUDA Graphs)" in text
    assert text.index("Start CUDA Graphs capture") < text.index("torch.OutOfMemoryError")
    assert fit.fit_config(config, 256).train_iters == fit.CUDA_GRAPH_WARMUP_STEPS + 2
    assert fit.fit_config(config.replace(cuda_graph_impl="none", cuda_graph_modules=()), 256).train_iters == fit.FIT_ITERS


def test_the_bank_answers_a_config_run_for_another_length():
    """The device ran 12 iterations; the experiment says 20: the same config otherwise."""
    base = TrainingConfig.from_dict(json.loads((RUN / "runs" / "1" / "config.json").read_text()))
    assert base.train_iters == 12
    entry = replay.find(base.replace(train_iters=20, profile_step_start=10, profile_step_end=13))
    assert entry and entry["name"] == "qwen3_30b_a3b-1gpu_t1_baseline"
    assert replay.find(base.replace(micro_batch=2, train_iters=20)) is None


def test_the_demo_replays_the_one_gpu_study_as_it_ran(tmp_path):
    """`make demo MODEL=qwen3_30b_a3b`: the bank's baseline ran on one GPU, so the demo tunes one GPU
    at a time, and makes the device's decisions again from the recorded logs and traces."""
    store = Store(str(tmp_path / "db.sqlite"))
    s = tuner.tune("qwen3_30b_a3b", store, executor="replay", runs_root=tmp_path / "runs", progress=False)
    assert s["study"] == "qwen3_30b_a3b-1gpu-replay"
    device = Store(str(RUN / "moetune.db"))
    dstudy = device.study("qwen3_30b_a3b-1gpu")

    def decided(st, study):
        number = {t.id: t.number for t in st.trials(study.id)}
        return [(number[d.trial_id], d.kind, d.rule) for d in st.decisions(study.id)
                if d.trial_id and d.kind in ("keep", "revert", "apply")]

    assert decided(store, store.study(s["study"]))[:9] == decided(device, dstudy)
    assert s["best_trial"] == 2 and s["kept_fixes"] == ["cuda_graphs_te"]


def test_a_completed_rank_close_to_capacity_is_not_memory_walled():
    """qwen3_235b's EP-128 rank on the H100 completed at 68.9 of 79.2 GB (95 % of the GPU with the
    fit's 7 GB headroom): its recorded trace and log are analysed as host overhead, not memory, and no
    memory fix is proposed for it. (Not compute-busy: one rank alone keeps the GPU half idle; the
    compute-busy case is tested on a synthetic trace, test_analysis_walls.py.)"""
    from moetune import analysis
    from moetune.decide import rules
    from moetune.experiment.schema import load_experiment
    bank = Path(__file__).resolve().parents[2] / "data" / "trial_bank"
    result = analysis.analyze([str(bank / "traces" / "qwen3_235b-1gpu_t3_raise_ep.sqlite.xz")],
                              log=str(bank / "logs" / "qwen3_235b-1gpu_t3_raise_ep.log.xz"))
    assert result["wall"] == "host_overhead"
    peak = result["metrics"]["combined"]["peak_memory_gb"]
    assert peak == pytest.approx(68.909, abs=0.01) and peak / result["gpu_memory_gb"] > 0.85
    exp = load_experiment("qwen3_235b")
    config = TrainingConfig.from_dict(json.loads((RUN / "runs" / "8" / "config.json").read_text()))
    props = rules.proposals(result, config, exp.model, exp.cluster, exp.tuning)
    assert props and not [p.rule.id for p in props if p.rule.wall == "memory"]
