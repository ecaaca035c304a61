"""benchmarks/predict_band.py: every public row's band holds its prediction, and the page says how
many measured steps fall inside their band, as the script counts them now."""
import sys

from moetune.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import predict_band  # noqa: E402


def test_each_band_holds_its_prediction_and_the_page_gives_the_count():
    rows = predict_band.rows()
    assert len(rows) >= 18
    for r in rows:
        assert r["low_s"] < r["predicted_s"] < r["high_s"], r["id"]
        assert len(r["dominant"]) == 3, r["id"]
    inside = sum(r["low_s"] <= r["measured_s"] <= r["high_s"] for r in rows)
    doc = (ROOT / "docs" / "prediction.md").read_text()
    assert f"inside the band in {inside} of {len(rows)} rows" in doc
