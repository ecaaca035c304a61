"""Kill the tuner (SIGKILL, a real subprocess) mid-study, start it again: the same best config,
no config run twice, every trial judged once."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moetune.tune import loop as tuner
from moetune.tune.summary import summary
from moetune.tune.state import JUDGED
from moetune.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import standin_bank  # noqa: E402

pytestmark = pytest.mark.e2e  # whole tuning studies: make test runs them, make unit leaves them out

REPO = Path(__file__).resolve().parents[2]
EXPERIMENT = str(REPO / "experiments" / "moe_proxy.yaml")
SCRIPT = ("import sys; from moetune.store import Store; from moetune.tune import loop as tuner; "
          "tuner.tune(sys.argv[1], Store(sys.argv[2]), executor='replay', runs_root=sys.argv[3], "
          "bank_dir=sys.argv[4], progress=False)")


def _start(db, runs, bank):
    return subprocess.Popen([sys.executable, "-c", SCRIPT, EXPERIMENT, str(db), str(runs), str(bank)],
                            cwd=REPO, start_new_session=True)


def _kill_after(proc, db, n_trials, timeout=120):
    store = Store(str(db))
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            studies = store.studies()
            if studies and len(store.trials(studies[0].id)) >= n_trials:
                break
        except Exception:
            pass
        if proc.poll() is not None:
            pytest.fail(f"tuner ended (rc {proc.returncode}) before {n_trials} trials")
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the tuner and its submitit job, as a node failure would
    proc.wait()


def test_kill_and_restart_gives_same_best_and_no_repeat(tmp_path):
    """A tuner killed twice and restarted ends with the uninterrupted run's best config, the same
    trials, none repeated and each judged once."""
    bank = tmp_path / "bank"
    standin_bank.build(bank)
    ref_store = Store(str(tmp_path / "ref.sqlite"))
    ref = tuner.tune(EXPERIMENT, ref_store, executor="replay", runs_root=tmp_path / "ref_runs",
                     bank_dir=bank, progress=False)

    db, runs = tmp_path / "db.sqlite", tmp_path / "runs"
    for n in (2, 4):  # killed twice, at different points
        _kill_after(_start(db, runs, bank), db, n)
    proc = _start(db, runs, bank)
    assert proc.wait(timeout=300) == 0

    store = Store(str(db))
    s = summary(store, ref["study"], runs)
    assert s["best_config_hash"] == ref["best_config_hash"]
    assert s["best_step_time_ms"] == ref["best_step_time_ms"]
    study = store.study(ref["study"])
    trials = store.trials(study.id)
    hashes = [t.config_hash for t in trials]
    assert len(hashes) == len(set(hashes))
    assert sorted(hashes) == sorted(t.config_hash for t in ref_store.trials(
        ref_store.study(ref["study"]).id))
    judged = {}
    for d in store.decisions(study.id):
        if d.trial_id and d.kind in JUDGED:
            judged[d.trial_id] = judged.get(d.trial_id, 0) + 1
    assert judged == {t.id: 1 for t in trials}
