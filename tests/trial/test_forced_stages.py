"""A stage re-run by hand (`moetune stage NAME --trial N --force`) never changes a study's record:
every stage of every trial of a finished study forced one by one, then the study run again, leaves
its decisions, each trial's row figures and metrics, and its Markdown report as they were. The study
replays the CPU stand-in bank (tests/standin_bank.py), as tests/tune/test_loop.py runs it."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from moetune.cli.main import main
from moetune.store import Store
from moetune.trial import stages

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import standin_bank  # noqa: E402

pytestmark = pytest.mark.e2e  # a whole tuning study: make test runs it, make unit leaves it out

EXPERIMENT = str(Path(__file__).resolve().parents[2] / "experiments" / "moe_proxy.yaml")
ROW = ("number", "config_hash", "parent_id", "fix", "state", "wall", "step_time_ms",
       "step_time_std_ms", "tflops_per_gpu", "peak_memory_gb")


def record(store: Store, md: Path) -> dict:
    """What a study's record says: decisions, each trial's row figures and metrics, the report."""
    study = store.studies()[0]
    trials = store.trials(study.id)
    return {
        "decisions": [(d.trial_id, d.kind, d.rule, d.reason, d.evidence) for d in store.decisions(study.id)],
        "rows": {t.id: {k: getattr(t, k) for k in ROW} for t in trials},
        "metrics": {t.id: [store.metrics(t.id)] + [store.metrics(t.id, rank=r) for r in range(2)]
                    for t in trials},
        "report": md.read_text(),
    }


@pytest.fixture
def study(tmp_path, monkeypatch):
    bank = tmp_path / "bank"
    bank.mkdir()
    standin_bank.build(bank)
    monkeypatch.chdir(tmp_path)
    # only what `demo` is told by its options: a stage by hand finds the bank from the study
    monkeypatch.delenv("MOETUNE_BANK", raising=False)
    db = str(tmp_path / "db.sqlite")
    demo = ["--db", db, "demo", EXPERIMENT, "--bank", str(bank), "--runs", "runs", "--out", "reports",
            "--no-progress"]
    assert main(demo) == 0
    store = Store(db)
    md = next((tmp_path / "reports").glob("*.md"))
    return db, demo, store, md


def test_forcing_every_stage_changes_nothing(study, capsys):
    db, demo, store, md = study
    before = record(store, md)
    forced = 0
    for t in store.trials(store.studies()[0].id):
        for name in stages.STAGE_ORDER:
            if store.last_stage(t.id, name) is None:  # a stage the trial never ran (not replayed...)
                continue
            assert main(["--db", db, "stage", name, "--trial", str(t.id), "--force"]) == 0, \
                capsys.readouterr().err
            forced += 1
            assert record(store, md)["rows"] == before["rows"], f"stage {name} of trial {t.id}"
    assert forced >= 6 * 3
    forced_record = record(store, md)
    assert main(demo) == 0
    after = record(store, md)
    for key in ("decisions", "rows", "metrics"):
        assert forced_record[key] == before[key], key
    for key in ("rows", "metrics", "report"):
        assert after[key] == before[key], key
    # each run of the study notes its preflight; every other decision is as it was
    new = after["decisions"][len(before["decisions"]):]
    assert after["decisions"][:len(before["decisions"])] == before["decisions"]
    assert [d[1] for d in new] == ["preflight"]


def test_forced_submit_of_a_replayed_study_replays_its_bank(study, monkeypatch):
    """The study's bank, not the CPU stand-in job script nor the default bank."""
    db, _, store, _ = study
    monkeypatch.setenv("MOETUNE_BANK", "/nonexistent/bank")
    trial = store.trials(store.studies()[0].id)[0]
    log = Path(trial.folder) / "log.txt"
    first = log.read_text()
    assert main(["--db", db, "stage", "submit", "--trial", str(trial.id), "--force"]) == 0
    assert main(["--db", db, "stage", "collect", "--trial", str(trial.id)]) == 0
    assert log.read_text() == first  # the bank's log of this config, replayed again
