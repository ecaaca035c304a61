"""tune/predicted.py, the step-time model in the tuner: layout and dispatcher moves ranked by it,
moves predicted slower than the incumbent skipped, predicted beside measured per trial, the
study's scale, and the GPU-hours the skips saved."""
import hashlib
import json
import sys
from pathlib import Path

import pytest
import yaml

from moetune.decide import rules as rules_mod
from moetune.decide.rules import Proposal, Rule
from moetune.experiment.config import TrainingConfig
from moetune.experiment.constraints import check
from moetune.experiment.schema import load_experiment
from moetune.estimate.pricing import price
from moetune.store import Store
from moetune.tune import loop as tuner
from moetune.tune import predicted

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import standin_bank  # noqa: E402

pytestmark = pytest.mark.e2e  # whole tuning studies: make test runs them, make unit leaves them out

PROXY = Path(__file__).resolve().parents[2] / "experiments" / "moe_proxy.yaml"
STANDIN_SCALE = 1.6  # the stand-in "cluster" runs this much slower than the model says
NOISE = 0.02  # the studies' noise_threshold: layouts closer than this to the sweep's best are its best


def _rule(rid, change):
    return Rule(id=rid, wall="communication", change=change, priority=50, rationale="", source="")


def test_layout_moves_ranked_by_prediction_in_their_own_slots():
    """Layout and dispatcher moves are re-ordered by predicted step time (unpriced ones last, in
    table order); the other moves keep their places in the table's order."""
    c = TrainingConfig()
    props = [Proposal(_rule("deepep", {"dispatcher": "flex"}), c), Proposal(_rule("overlap", {"overlap_ep_a2a": True}), c),
             Proposal(_rule("etp1", {"etp": 1}), c), Proposal(_rule("unpriced", {"ep": 2}), c),
             Proposal(_rule("halve_ep", {"ep": {"div": 2}}), c)]
    ms = {"deepep": 90.0, "etp1": 120.0, "halve_ep": 80.0, "unpriced": None}
    assert [p.rule.id for p in predicted.ranked(props, ms)] == ["halve_ep", "overlap", "deepep", "etp1", "unpriced"]


def test_skip_only_beyond_the_noise_and_the_scale_is_the_median_ratio():
    """A move is skipped only when predicted slower than the incumbent by more than the relative
    noise; the study's scale is the median of measured / model over trials with both; the
    GPU-hours of a skipped trial stop at the job's time limit."""
    assert not predicted.slower(101.9, 100.0, 0.02) and predicted.slower(102.1, 100.0, 0.02)
    assert predicted.correction([]) == (1.0, 0)
    assert predicted.correction([(160.0, 100.0), (150.0, 100.0), (300.0, 100.0), (None, 90.0)]) == (1.6, 3)
    assert predicted.gpu_hours(16, 1000.0, 36, 30) == pytest.approx(16 * 36 / 3600)
    assert predicted.gpu_hours(16, 1000.0, 10_000, 30) == pytest.approx(16 * 0.5)


# -- the stand-in study ------------------------------------------------------------------------
# two 8-GPU nodes without DeepEP or HybridEP built: the layout moves are ETP 1 (first in the
# table) and halving EP into the NVLink domain. ETP 1 gains a little and leaves EP 4 x ETP 1 inside
# the node, where no layout move is left; halving EP first is the model's pick and the sweep's best.
CLUSTER = {"name": "standin-2x8", "executor": "local", "nodes": 2, "gpus_per_node": 8, "gpu_type": "H100",
           "nvlink_domain": 8, "time_limit": "00:30:00", "template": "venv", "has_transformer_engine": True,
           "has_deep_ep": False, "has_hybrid_ep": False, "profile_ranks": [0, 1]}
BASELINE = {"tp": 4, "ep": 4, "etp": 4, "sequence_parallel": True, "micro_batch": 16, "global_batch": 64,
            "dispatcher": "alltoall", "transformer_impl": "transformer_engine", "train_iters": 16,
            "profile_step_start": 10, "profile_step_end": 13}
# what the stand-in trace's analysis shows of a layout whose communication is exposed
COMM_WALL = {"wall": "communication", "metrics": {"combined": {
    "exposed_a2a_share": 0.3, "exposed_a2a_share_net": 0.3, "exposed_comm_share": 0.3, "comm_share": 0.3}}}


def _experiment(tmp: Path, predict_moves: bool) -> Path:
    data = yaml.safe_load(PROXY.read_text())
    data.update(name="standin_layouts", cluster=CLUSTER, baseline=BASELINE)
    data["tuning"] = {"budget_trials": 8, "noise_threshold": NOISE, "patience": 3, "predict_moves": predict_moves}
    path = tmp / f"standin_layouts_{predict_moves}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def sweep(exp) -> list[TrainingConfig]:
    """Every layout the table's layout and dispatcher moves reach from the baseline (the checker's
    refusals left out): the exhaustive sweep."""
    layout_rules = [r for r in rules_mod.load_rules() if predicted.moves_layout(r)]
    seen, todo = {exp.baseline.config_hash(): exp.baseline}, [exp.baseline]
    while todo:
        for p in rules_mod.proposals(COMM_WALL, todo.pop(), exp.model, exp.cluster, exp.tuning, check=check,
                                     rules=layout_rules):
            if p.ok and p.config.config_hash() not in seen:
                seen[p.config.config_hash()] = p.config
                todo.append(p.config)
    return list(seen.values())


# the all-to-all's kernel as each dispatcher names it (moetune/analysis/kernels.py classes)
A2A_KERNEL = {None: "ncclDevKernel_SendRecv", "deepep": "deep_ep::internode::dispatch",
              "hybridep": "hybrid_ep::dispatch"}


def _jitter(name: str) -> float:
    return (hashlib.sha256(name.encode()).digest()[0] / 255.0 - 0.5) * 0.02  # +-1 %


def build_bank(bank_dir: Path, exp) -> dict[str, float]:
    """A stand-in bank of the sweep: each layout's step is the model's own prediction x
    STANDIN_SCALE x (1 +- 1 %), split into the stand-in trace's parts by the model's terms
    (compute and optimizer; communication exposed; host launch and pipeline bubble as idle)."""
    model = predicted.Model(exp)
    (bank_dir / "trials").mkdir(parents=True, exist_ok=True)
    rows, steps = [], {}
    for i, cfg in enumerate(sweep(exp)):
        name = f"layout{i}"
        t = price(exp, cfg, model.readings).terms  # priced as the tuner's model prices it (its rates)
        f = STANDIN_SCALE * (1 + _jitter(name))
        parts = {"compute": (t["compute"] + t["optimizer"]) * f,
                 "a2a": (t["ep_a2a"] + t["tp_collectives"] + t["pp_sends"] + t["dp_grad_reduce"]
                         + t["dp_param_gather"]) * f,
                 "hidden": 0.0, "idle": (t["host_launch"] + t["pipeline_bubble"]) * f}
        log = standin_bank.write_log(bank_dir / "trials" / f"{name}.log", parts, name)
        trace = standin_bank.write_trace(bank_dir / "trials" / f"{name}.sqlite", name, parts,
                                         sendrecv_name=A2A_KERNEL[cfg.flex_backend if cfg.dispatcher == "flex" else None])
        steps[cfg.config_hash()] = sum(v for k, v in parts.items() if k != "hidden")
        rows.append({"name": name, "args": [], "config": cfg.to_dict(), "state": "COMPLETED",
                     "step_time_ms": round(steps[cfg.config_hash()], 3), "log": standin_bank._xz(log),
                     "trace": standin_bank._xz(trace), "analysis": None, "stand_in": True})
    (bank_dir / "bank.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return steps


def _trials_to(store, s, hashes: set) -> int | None:
    """Trials run until the first of a config in `hashes` (the baseline is trial 1); None: never."""
    study = store.study(s["study"])
    return next((t.number for t in store.trials(study.id) if t.config_hash in hashes), None)


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("standin_layouts")
    exp_with, exp_without = _experiment(tmp, True), _experiment(tmp, False)
    steps = build_bank(tmp / "bank", load_experiment(str(exp_with)))
    out = {}
    for key, path in (("model", exp_with), ("table", exp_without)):
        store = Store(str(tmp / f"{key}.sqlite"))
        s = tuner.tune(str(path), store, executor="replay", runs_root=tmp / f"runs_{key}", bank_dir=tmp / "bank",
                       progress=False)
        out[key] = (store, s)
    return steps, out


def test_model_ranking_reaches_the_sweeps_best_in_fewer_trials(studies):
    """A stand-in study over the layouts the table's moves reach (4 of them here, all in the bank,
    each step the model's own prediction x 1.6 x (1 +- 1 %), so this proves the tuner uses the
    ranking and the skip, not that the model is right): with the model the study runs the sweep's
    best layout (EP 2, trial 2) and keeps it, skipping ETP 1 from there as predicted slower, and
    the summary gives the GPU-hours that skip saved; in table order the study keeps another move
    and stops short of the sweep's best, or reaches it later in more trials."""
    steps, out = studies
    best = {h for h, ms in steps.items() if ms <= min(steps.values()) * (1 + NOISE)}
    (m_store, m), (t_store, t) = out["model"], out["table"]
    with_model, without = _trials_to(m_store, m, best), _trials_to(t_store, t, best)
    assert len(steps) >= 4
    assert with_model is not None and m["best_config_hash"] in best
    # in table order the study never reaches the sweep's best, or reaches it later, with more trials
    assert without is None or (with_model < without and t["trials"] > m["trials"])
    assert m["skipped_by_prediction"] >= 1 and m["gpu_hours_saved"] > 0
    assert t["skipped_by_prediction"] == 0 and t["gpu_hours_saved"] == 0


def test_every_completed_trial_records_prediction_and_the_scale_learns(studies):
    """Each completed trial stores the model's step time, part by part, beside its measured one;
    after the first trial the study's scale is the stand-in's 1.6 within its noise, and so is the
    correction of each part the model gives (compute, communication); a skip's evidence holds the
    prediction corrected part by part against the incumbent's measured step."""
    _, out = studies
    store, s = out["model"]
    study = store.study(s["study"])
    for t in store.trials(study.id):
        m = store.metrics(t.id)
        assert m["predicted_model_ms"] > 0 and m["judged_step_time_ms"] > 0
        assert m["predicted_model_ms"] == pytest.approx(sum(m[f"predicted_{g}_ms"] for g in predicted.TERM_GROUPS))
    assert s["prediction_scale"] == pytest.approx(STANDIN_SCALE, rel=0.03)
    scales = s["prediction_correction"]["scales"]
    assert {"compute", "comm"} <= set(scales)
    assert all(v == pytest.approx(STANDIN_SCALE, rel=0.05) for v in scales.values()), scales
    skip = next(d for d in store.decisions(study.id) if d.kind == "skip" and (d.evidence or {}).get("prediction"))
    f = skip.evidence["prediction"]
    assert f["slower"] and f["step_time_ms"] > f["incumbent_ms"] * 1.02
    corr = predicted.TermCorrection(f["correction"]["scales"], f["correction"]["offsets_ms"])
    assert f["step_time_ms"] == pytest.approx(corr.apply(f["model_terms_ms"]), rel=1e-3)


def test_study_report_shows_prediction_beside_measurement(studies):
    """The study report (Markdown and HTML from one model) has the predicted and measured step of
    every trial side by side, the study's scale, and the GPU-hours the skips saved."""
    from moetune.report import study as report
    _, out = studies
    store, s = out["model"]
    r = report.build(store, s["study"])
    col = r.trials.header.index("predicted ms")
    assert r.trials.header[col - 1] == "judged ms" and r.trials.header[col + 1] == "measured/model"
    assert all(row[col] != "–" and row[col - 1] != "–" for row in r.trials.rows)
    text = report.render_markdown(r)
    assert f"saving {s['gpu_hours_saved']:.2f} GPU-hours" in text and "measured / model 1.6" in text
    assert "predicted ms" in report.render_html(r)


def test_the_correction_scales_each_part_and_offsets_one_the_model_barely_gives():
    """term_correction: a part's scale is the median of measured / model over the trials where the
    model gives it at least TERM_FLOOR of the step; a part it never gives that much is added as the
    median of measured minus model; apply() sums the corrected parts; no trial, no correction."""
    rows = [({"compute": 200.0, "comm": 30.0, "idle": 12.0}, {"compute": 100.0, "comm": 10.0, "idle": 0.0}),
            ({"compute": 220.0, "comm": 90.0, "idle": 8.0}, {"compute": 100.0, "comm": 40.0, "idle": 1.0}),
            ({"compute": 180.0, "comm": 2.0, "idle": 10.0}, {"compute": 100.0, "comm": 1.0, "idle": 0.0})]
    c = predicted.term_correction(rows)
    # comm: 3.0 and 2.25 from the first two (10/110, 40/141 of the step); 1/101 is under the floor
    assert c.scales == pytest.approx({"compute": 2.0, "comm": 2.625})
    assert c.offsets == pytest.approx({"idle": 10.0}) and c.trials == 3
    assert c.apply({"compute": 50.0, "comm": 20.0, "idle": 0.0}) == pytest.approx(100 + 52.5 + 10)
    none = predicted.term_correction([])
    assert none.apply({"compute": 50.0, "comm": 20.0, "idle": 3.0}) == 73.0


def test_part_by_part_correction_prices_a_layout_a_single_scale_misprices(tmp_path):
    """Two layouts of the stand-in's sweep whose communication shares differ (the model's own
    parts): on a 'cluster' whose kernels run 1.2x the model and whose links 3x, the correction
    learned from the first layout's measured parts, as the loop reads them back from its trace's
    shares (measured_terms), prices the second exactly, where the single scale of the first (its
    whole step's measured / model) is off by more than the noise."""
    exp = load_experiment(str(_experiment(tmp_path, True)))
    model = predicted.Model(exp)
    priced = [(c, model.terms(c)) for c in sweep(exp)]
    share = lambda t: t["comm"] / sum(t.values())  # noqa: E731
    (a, ta), (b, tb) = min(priced, key=lambda x: share(x[1])), max(priced, key=lambda x: share(x[1]))
    assert share(tb) - share(ta) > 0.1
    factor = {"compute": 1.2, "comm": 3.0, "idle": 1.0}
    cluster = lambda t: {g: v * factor[g] for g, v in t.items()}  # noqa: E731
    step_a, step_b = sum(cluster(ta).values()), sum(cluster(tb).values())
    metrics = {"judged_step_time_ms": step_a, "exposed_comm_share": cluster(ta)["comm"] / step_a,
               "gpu_idle_share": cluster(ta)["idle"] / step_a}
    corr = predicted.term_correction([(predicted.measured_terms(metrics), ta)])
    assert corr.apply(tb) == pytest.approx(step_b, rel=1e-9)
    single, _ = predicted.correction([(step_a, sum(ta.values()))])
    assert abs(single * sum(tb.values()) / step_b - 1) > NOISE


def test_the_model_reads_what_the_study_records_after_it_was_built(tmp_path):
    """The tuner's model prices through the study's store: a fit of a layout recorded after the
    model was built (as fit-first records it before the trial runs) replaces its analytic compute
    at the next pricing, as `moetune predict` would read it."""
    exp = load_experiment(str(_experiment(tmp_path, True)))
    store = Store(str(tmp_path / "s.sqlite"))
    model = predicted.Model(exp, store)
    before = model.terms(exp.baseline)
    study = store.create_study("standin-fit", exp.model.name, {"cluster": {"gpu_type": exp.cluster.gpu_type}})
    t = store.add_trial(study.id, exp.baseline.to_dict(), exp.baseline.config_hash(), fix="fit")
    store.set_metrics(t.id, {"fit_compute_ms": 1000.0})
    after = model.terms(exp.baseline)
    assert before is not None and after is not None
    assert after["compute"] != pytest.approx(before["compute"], rel=1e-3)
    assert after["comm"] == pytest.approx(before["comm"])  # only compute is measured


def _propose_against(tmp: Path, incumbent_ms: float, config: TrainingConfig, terms, band):
    """The loop's proposal step on one layout move (`config`, its model parts and band) from a
    baseline trial whose judged step is `incumbent_ms`: the decision it records."""
    from moetune.tune.state import StudyState
    exp = load_experiment(str(_experiment(tmp, True)))
    store = Store(str(tmp / "s.sqlite"))
    t = tuner.Tuner(exp, store, executor="local", runs_root=tmp / "runs", study_name="band", progress=False)
    parent = store.add_trial(t.study.id, exp.baseline.to_dict(), exp.baseline.config_hash())
    store.set_metrics(parent.id, {"judged_step_time_ms": incumbent_ms})
    prop = Proposal(_rule("halve_ep", {"ep": {"div": 2}}), config)
    added = t._propose(StudyState(), store.trial(parent.id), {"wall": "communication"}, [prop],
                       {"halve_ep": terms}, {"halve_ep": band})
    return added, store.decisions(t.study.id)[-1]


def test_a_move_slower_inside_its_band_is_tried_and_one_slower_beyond_it_skipped(tmp_path):
    """The skip rule reads the band: a move the model prices 5 % slower than the incumbent (the
    2 % noise rule alone would skip it) is tried while its band's fast end is not slower than the
    incumbent plus the noise; against an incumbent faster than that fast end by more than the
    noise it is skipped, its band in the decision's evidence."""
    exp = load_experiment(str(_experiment(tmp_path, True)))
    config = next(c for c in sweep(exp) if c.ep == exp.baseline.ep // 2)
    terms, band = predicted.Model(exp).priced(config)
    ms = sum(terms.values())
    assert band.low_ms < ms / 1.05  # the band is wider than the 5 % the move is slower by
    assert predicted.slower(ms, ms / 1.05, NOISE)  # the noise rule alone would skip it

    (tmp_path / "inside").mkdir()
    added, d = _propose_against(tmp_path / "inside", ms / 1.05, config, terms, band)
    assert added and d.kind == "apply"
    f = d.evidence["prediction"]
    assert not f["slower"] and f["step_time_low_ms"] < f["incumbent_ms"] * (1 + NOISE) < f["step_time_ms"]

    (tmp_path / "beyond").mkdir()
    added, d = _propose_against(tmp_path / "beyond", band.low_ms / 1.05, config, terms, band)
    assert not added and d.kind == "skip" and "beyond the band" in d.reason
    f = d.evidence["prediction"]
    assert f["slower"] and f["step_time_low_ms"] > f["incumbent_ms"] * (1 + NOISE)
    assert f["band_rows"] == [r.name for r in band.dominant()]


def test_moves_are_ranked_by_their_expected_step_within_the_band():
    """Of two moves the model prices alike, the one whose band reaches further up is expected to
    take longer and is ranked after the other; without a band the model's step ranks them."""
    from moetune.estimate.band import Band
    c = TrainingConfig()
    props = [Proposal(_rule("wide", {"ep": 2}), c), Proposal(_rule("narrow", {"etp": 1}), c)]
    terms = {"compute": 100.0}
    wide, narrow = Band(100.0, 90.0, 160.0), Band(100.0, 90.0, 115.0)
    ms = {"wide": predicted.expected_ms(terms, wide), "narrow": predicted.expected_ms(terms, narrow)}
    assert ms["wide"] == pytest.approx(350 / 3) and ms["narrow"] == pytest.approx(305 / 3)
    assert [p.rule.id for p in predicted.ranked(props, ms)] == ["narrow", "wide"]
    assert predicted.expected_ms(terms, None) == 100.0 and predicted.expected_ms(None, wide) is None
