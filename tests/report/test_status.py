"""report/status.py, `moetune status`: every study of a store as text, with each trial's judged and
profiled step time and each decision with its evidence, on the recorded device study's store."""
import re
import shutil
from pathlib import Path

from moetune.report import status
from moetune.store import Store

PREV = Path(__file__).resolve().parents[1] / "data" / "gpu" / "tuning_2se"


def recorded_store(tmp_path) -> Store:
    db = tmp_path / "moetune.db"
    shutil.copyfile(PREV / "moetune.db", db)
    return Store(str(db))


def test_status_lists_trials_and_decisions(tmp_path):
    """The recorded study as text: its judged baseline and best, one row per trial with its fix,
    state and hash, and one line per decision with the evidence that decided it."""
    store = recorded_store(tmp_path)
    text = status.render(store)
    study = store.study("moe_proxy")
    assert text.startswith("study moe_proxy (done) model moe_proxy: 6 trials run, 0 skipped")
    assert "baseline 560.1 ms, best 359.3 ms (trial 3)" in text
    assert "stopped: no gain in the last 3 trials (patience 3)" in text
    for t in store.trials(study.id):
        assert f" {(t.fix or 'baseline')[:28]:<28} {t.state:<10} " in text and t.config_hash in text
    decisions = store.decisions(study.id)
    assert len(text.split("  decisions:\n", 1)[1].splitlines()) == len(decisions)
    assert "keep        trial 3" in text and "parent_step_time_ms=560.1" in text
    assert re.search(r"judged ms +profiled +tokens/s +TFLOP/s +peak GiB +wall", text)


def test_an_empty_store_says_how_to_start(tmp_path):
    """A store without studies says so in one line and names the commands that make one."""
    text = status.render(Store(str(tmp_path / "db.sqlite")))
    assert text.startswith("no studies in ") and "moetune tune MODEL" in text and "\n" not in text


def test_one_study_by_name(tmp_path):
    """Asked for one study, status renders that one alone."""
    store = recorded_store(tmp_path)
    store.create_study("other", model="m")
    assert status.render(store, "moe_proxy") == status.render_study(store, "moe_proxy")
    assert "study other" in status.render(store) and "study other" not in status.render(store, "moe_proxy")


def test_status_prints_sensible_precision(tmp_path):
    """Step times and noise to 0.1 ms and p to three digits, though the store keeps more digits
    (the recorded baseline's profiled step is 802.3773 ms)."""
    out = status.render(recorded_store(tmp_path))
    assert " 802.4 " in out and "802.3773" not in out
    assert not re.search(r"_ms=\d+\.\d{2,}", out) and not re.search(r"p_faster=\d\.\d{4,}", out)
