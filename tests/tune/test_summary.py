"""tune/summary.py: a study in one dict (what `moetune status`, the reports and `moetune tune`
print), on the recorded device study's store: its budget, baseline and best, the kept fixes, the
speedups and how it stopped."""
import shutil
from pathlib import Path

import pytest

from moetune.store import Store
from moetune.tune.summary import summary

PREV = Path(__file__).resolve().parents[1] / "data" / "gpu" / "tuning_2se"


@pytest.fixture
def store(tmp_path):
    db = tmp_path / "moetune.db"
    shutil.copyfile(PREV / "moetune.db", db)
    return Store(str(db))


def test_the_recorded_study_in_one_dict(store):
    """Six trials ran; trial 3 (larger_micro_batch) is the best; the speedups are the baseline's
    step over the best's, profiled and judged; the stop reason is the stop decision's."""
    s = summary(store, "moe_proxy")
    assert (s["trials"], s["trials_total"], s["skipped"]) == (6, 6, 0)
    assert s["best_trial"] == 3 and s["kept_fixes"] == ["larger_micro_batch"]
    assert s["best_config"]["micro_batch"] == 4 and s["best_config_hash"] == "74accb21b07dcafb"
    assert (s["baseline_judged_step_time_ms"], s["best_judged_step_time_ms"]) == (560.1, 359.3)
    assert s["judged_speedup"] == round(560.1 / 359.3, 4)
    assert s["speedup"] == round(s["baseline_step_time_ms"] / s["best_step_time_ms"], 4)
    assert s["stop_reason"] == "no gain in the last 3 trials (patience 3)"
    assert "best_command" not in s  # no runs folder given


def test_best_command_is_read_from_the_best_trials_folder(store, tmp_path):
    """With a runs folder, the best trial's command.txt (in the folder its render stage recorded) is
    the best command; absent, it is None."""
    runs = tmp_path / "runs"
    folder = runs / "moe_proxy" / "3"
    best = store.trials(store.study("moe_proxy").id)[2]
    store.update_trial(best.id, folder=str(folder))
    assert summary(store, "moe_proxy", runs)["best_command"] is None
    folder.mkdir(parents=True)
    (folder / "command.txt").write_text("torchrun pretrain_gpt.py --micro-batch-size 4\n")
    assert summary(store, "moe_proxy", runs)["best_command"] == "torchrun pretrain_gpt.py --micro-batch-size 4"


def test_skipped_and_pending_trials_are_not_counted_as_run(tmp_path):
    """A study with a skipped and a pending trial counts neither as run, and without a kept trial
    has no best and no speedup."""
    store = Store(str(tmp_path / "db.sqlite"))
    st = store.create_study("s", model="m")
    for h, state in (("a", "completed"), ("b", "skipped"), ("c", "pending")):
        store.update_trial(store.add_trial(st.id, {"h": h}, h, fix=None).id, state=state)
    s = summary(store, "s")
    assert (s["trials"], s["trials_total"], s["skipped"]) == (1, 3, 1)
    assert s["best_trial"] is None and "speedup" not in s and s["stop_reason"] is None
