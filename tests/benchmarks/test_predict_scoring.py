"""benchmarks/predict_scoring.py, the score of the step-time model on runs it was not shaped on: a
layout measured several times counts once (the median of its measurements), pairs are two layouts
of one model more than 10 % apart, TFLOP/s figures become tokens/s by Megatron-LM's own FLOP count,
and the page quotes the results file."""
import json
import statistics
import subprocess
import sys
from types import SimpleNamespace

import pytest
import yaml

from moetune.experiment.schema import load_experiment
from moetune.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import predict_scoring  # noqa: E402
import predict_validation  # noqa: E402

DOC = ROOT / "docs" / "prediction.md"
LAYOUT = {"tp": 1, "pp": 4, "vpp": 8, "ep": 8, "etp": 1, "micro_batch": 1, "global_batch": 256, "seq_length": 4096}


def small_yaml(tmp_path, figures: dict[str, float]) -> tuple:
    """A scoring file of Mixtral 8x7B rows: three releases of one layout (tokens/s/GPU), one of EP 4
    (a step time) and one of PP 8 (TFLOP/s under MCore v0.8's count)."""
    base = {"model": "mixtral_8x7b", "source": "https://github.com/x/y", "section": "s", "hardware": "h",
            "gpus": 64, "settings": {"dispatcher": "alltoall"}, "settings_source": "s", "precision": "BF16"}
    rows = [{**base, "id": f"ep8-{rel}", "release": rel, "layout": LAYOUT, "tokens_per_s_per_gpu": figures[rel]}
            for rel in ("a", "b", "c")]
    rows.append({**base, "id": "ep4", "release": "d", "layout": {**LAYOUT, "ep": 4},
                 "step_time_s": figures["ep4_step_s"]})
    rows.append({**base, "id": "pp8", "release": "e", "layout": {**LAYOUT, "pp": 8, "vpp": 4},
                 "tflops_per_gpu": figures["pp8_tflops"], "flop_count": "megatron_v0.8"})
    path = tmp_path / "rows.yaml"
    path.write_text(yaml.safe_dump({"frozen_commit": "0" * 7, "common": {"distributed_optimizer": True},
                                    "rows": rows}))
    return path, rows


def test_a_layout_measured_several_times_counts_once(tmp_path):
    figures = {"a": 4000.0, "b": 5200.0, "c": 4100.0, "ep4_step_s": 4.0, "pp8_tflops": 300.0}
    path, rows = small_yaml(tmp_path, figures)
    priced = predict_scoring.priced(path, None)
    s = predict_scoring.score(priced)
    assert (s["rows"], s["layouts"]) == (5, 3)
    merged = next(g for g in s["by_layout"] if len(g["rows"]) == 3)
    assert sorted(merged["rows"]) == ["ep8-a", "ep8-b", "ep8-c"]
    assert merged["measured"] == statistics.median([figures["a"], figures["b"], figures["c"]])
    one_prediction = {r["predicted"] for r in priced if r["id"].startswith("ep8-")}
    assert len(one_prediction) == 1 and merged["predicted"] == one_prediction.pop()
    # the median over layouts is over three entries, not five rows
    layout_errors = [abs(g["measured"] / g["predicted"] - 1) for g in s["by_layout"]]
    assert s["layout_median_abs_error"] == pytest.approx(statistics.median(layout_errors), abs=1e-3)
    # each figure turned into tokens/s/GPU its own way
    ep4 = next(r for r in priced if r["id"] == "ep4")
    assert ep4["measured"] == pytest.approx(256 * 4096 / 64 / figures["ep4_step_s"], abs=0.1)
    pp8 = next(r for r in priced if r["id"] == "pp8")
    per_token = predict_validation.megatron_flop_per_token(load_experiment("mixtral_8x7b").model, 4096, 1, False)
    assert pp8["measured"] == pytest.approx(figures["pp8_tflops"] * 1e12 / per_token, abs=0.1)


def test_pairs_are_distinct_layouts_more_than_ten_percent_apart(tmp_path):
    # EP 8's three releases are within 10 % of 4000 except b; EP 4 is 2x slower in measured speed
    figures = {"a": 4000.0, "b": 4300.0, "c": 4100.0, "ep4_step_s": 8.0, "pp8_tflops": 330.0}
    path, _ = small_yaml(tmp_path, figures)
    priced = predict_scoring.priced(path, None)
    speed = {r["id"]: r["measured"] for r in priced}
    gap = lambda a, b: max(speed[a], speed[b]) / min(speed[a], speed[b]) - 1  # noqa: E731
    ids = sorted(speed)
    expected_rows = sum(1 for i, a in enumerate(ids) for b in ids[i + 1:]
                        if not (a.startswith("ep8") and b.startswith("ep8")) and gap(a, b) > 0.10)
    s = predict_scoring.score(priced)
    assert s["pairs"]["all"] == expected_rows
    groups = {g["id"].split(" ")[0]: g["measured"] for g in s["by_layout"]}
    names = sorted(groups)
    expected_layouts = sum(1 for i, a in enumerate(names) for b in names[i + 1:]
                           if max(groups[a], groups[b]) / min(groups[a], groups[b]) - 1 > 0.10)
    assert s["layout_pairs"]["all"] == expected_layouts
    # a pair is right when the model orders it as measured: swapping the two predictions flips it
    layouts = predict_scoring.by_layout(priced)
    slow = next(g for g in layouts if g["id"] == "ep4")
    fast = next(g for g in layouts if g["id"].startswith("ep8"))
    assert fast["measured"] > 1.1 * slow["measured"]

    def verdict() -> bool:
        return next(p["ranked_right"] for p in predict_validation.pairs(layouts)
                    if {p["faster"], p["slower"]} == {slow["id"], fast["id"]})
    before = verdict()
    slow["predicted"], fast["predicted"] = fast["predicted"], slow["predicted"]
    assert verdict() != before


def test_megatron_flop_count_matches_the_model_zoo_own_figures():
    """The Model Zoo's Qwen3-235B table gives both a step time and TFLOP/s for two rows (GBS 2048,
    seq 4096, 256 GPUs): Megatron-LM's causal count reproduces its TFLOP/s from its step time."""
    model = load_experiment("qwen3_235b").model
    per_token = predict_validation.megatron_flop_per_token(model, 4096, 2, True)
    for step_s, tflops in ((19.7, 245), (17.6, 276)):
        tokens = 2048 * 4096 / 256 / step_s
        assert tokens * per_token / 1e12 == pytest.approx(tflops, rel=0.015)
    # the whole score matrix (MCore v0.8's count) is more FLOPs a token
    assert predict_validation.megatron_flop_per_token(model, 4096, 2, False) > per_token


def test_every_unseen_row_says_where_it_is_from_and_none_was_built_on():
    data = yaml.safe_load(predict_scoring.UNSEEN.read_text())
    assert str(data["frozen_commit"]) == "486cbc4"
    built = {(r["model"], r["source"], r["section"]) for r in
             yaml.safe_load(predict_validation.PUBLIC.read_text())["rows"]}
    for r in data["rows"]:
        for key in ("source", "hardware", "release", "layout", "settings", "settings_source", "precision",
                    "page_read_while_building"):
            assert r.get(key) is not None, (r["id"], key)
        assert r["source"].startswith("https://github.com/"), r["id"]
        assert sum(k in r for k in ("tokens_per_s_per_gpu", "step_time_s", "tflops_per_gpu")) == 1, r["id"]
        assert (r["model"], r["source"], r["section"]) not in built, r["id"]


def test_the_frozen_checkout_must_be_the_frozen_commit():
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    other = "f" * 7 if not head.startswith("f" * 7) else "e" * 7
    with pytest.raises(SystemExit, match="not " + other):
        predict_scoring.check_frozen(ROOT, other)


def test_the_page_quotes_the_results_file():
    """docs/prediction.md's "Scored on unseen runs" holds the results file's summary table, made by
    the frozen model at the yaml's commit."""
    r = json.loads(predict_scoring.RESULTS.read_text())
    assert r["frozen_commit"] == str(yaml.safe_load(predict_scoring.UNSEEN.read_text())["frozen_commit"])
    assert r["frozen_checkout_head"].startswith(r["frozen_commit"])
    assert predict_scoring.render(r) in DOC.read_text()


def test_an_imported_models_row_prices_what_was_published_not_its_plans_choice():
    """GPT-OSS-120B is imported (`moetune new --from-hf`), so its experiment's baseline is the layout
    its plan picked; its row's config starts from Megatron's defaults: what a plan turned on and the
    row does not name (here Megatron FSDP) stays off, and the row's own layout holds. A shipped
    model's row keeps its baseline's settings."""
    pv = predict_validation
    data = yaml.safe_load(predict_scoring.UNSEEN.read_text())
    row = next(r for r in data["rows"] if r["model"] == "gpt_oss_120b")
    exp = pv.imported_experiment(row["model"], row["hf_config"], row["gpus"])
    chosen = SimpleNamespace(baseline=exp.baseline.replace(fsdp=True))
    config = pv.row_config(chosen, data["common"], row)
    assert not config.fsdp and config.pp_layout is None
    assert (config.tp, config.pp, config.ep) == (row["layout"]["tp"], row["layout"]["pp"], row["layout"]["ep"])
    built = yaml.safe_load(pv.PUBLIC.read_text())
    shipped_row = next(r for r in built["rows"] if not r.get("hf_config") and "fsdp" not in r["settings"])
    shipped = SimpleNamespace(baseline=load_experiment(shipped_row["model"]).baseline.replace(fsdp=True))
    assert pv.row_config(shipped, built["common"], shipped_row).fsdp
