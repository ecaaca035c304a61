"""benchmarks/predict_validation.py, the script behind docs/prediction.md's validation tables:
the page holds exactly what the script prints now (rows, errors, the median error, the pairs), so
neither the model nor the page can change without the other; no network (public figures come from
benchmarks/predict_validation.yaml, each row with its source)."""
import sys

import yaml

from moetune.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import predict_validation  # noqa: E402

DOC = ROOT / "docs" / "prediction.md"


def test_the_page_holds_what_the_script_prints():
    """Every line of the script's tables, the median error sentence included, is on the page, and
    the page's headline figure is the script's median absolute error."""
    report = predict_validation.report()
    text = predict_validation.render(report)
    doc = DOC.read_text()
    assert text in doc
    median = f"{report['public_median_abs_error']:.1%}".replace("%", " %")
    assert f"Median absolute step-time error on the public H100 rows: {median} over {len(report['public'])} rows" \
        in doc


def test_every_public_row_says_where_it_is_from():
    """Each public row names its source URL, hardware, release, layout, precision and where its
    settings come from, and gives one measured figure."""
    rows = yaml.safe_load(predict_validation.PUBLIC.read_text())["rows"]
    for r in rows:
        for key in ("source", "hardware", "release", "layout", "settings", "settings_source", "precision"):
            assert r.get(key) is not None, (r["id"], key)
        assert r["source"].startswith("https://github.com/"), r["id"]
        assert ("tokens_per_s_per_gpu" in r) != ("step_time_s" in r), r["id"]


def test_pairs_are_layouts_of_one_model_more_than_ten_percent_apart():
    """A pair: two rows of one model with different layouts whose measurements differ by more than
    10 %, the faster one named first."""
    report = predict_validation.report()
    rows = {r["id"]: r for r in report["public"]}
    assert report["pairs"]
    for p in report["pairs"]:
        a, b = rows[p["faster"]], rows[p["slower"]]
        assert a["model"] == b["model"] and a["layout"] != b["layout"]
        assert a["measured"] > b["measured"] * 1.1


def test_a_pair_measured_both_ways_is_one_whose_layouts_another_pair_orders_the_other_way():
    """measurements_disagree: the same two layouts (from other rows, other releases) appear in
    another pair with the other one faster; the summary's one-way and both-ways pairs add up to all
    of them, and each count of right ones is within its group."""
    report = predict_validation.report()
    ps, s = report["pairs"], report["pair_summary"]
    for p in ps:
        other_way = [q for q in ps if q["layouts"] == p["layouts"] and q is not p and q["faster"] != p["faster"]]
        flipped = [q for q in other_way if predict_validation.key_of(report["public"], q["faster"])
                   != predict_validation.key_of(report["public"], p["faster"])]
        assert p["measurements_disagree"] == bool(flipped), p
    assert s["one_way"] + s["both_ways"] == s["all"]
    assert s["one_way_right"] + s["both_ways_right"] == s["all_right"]
    assert s["one_way_right"] <= s["one_way"] and s["both_ways_right"] <= s["both_ways"]
