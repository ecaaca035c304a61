"""data/trial_bank_build.py --add: one recorded run folded into a copy of the bank; the other
entries stay, and stored traces are analysed again by the current analysis."""
import pytest
import importlib
import json
import lzma
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "gpu"


@pytest.mark.e2e
def test_add_keeps_the_bank_and_adds_the_run(tmp_path, monkeypatch):
    """Adding a run keeps the bank's entries, adds the new one with its trace and log, re-analyses
    entries with traces and keeps recorded analyses where traces were dropped."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    tbb = importlib.import_module("trial_bank_build")
    bank = tmp_path / "bank"
    shutil.copytree(REPO / "data" / "trial_bank", bank)
    before = [json.loads(x) for x in (bank / "bank.jsonl").read_text().splitlines()]
    before = [e for e in before if e["name"] != "flex_deepep"]
    (bank / "bank.jsonl").write_text("".join(json.dumps(e) + "\n" for e in before))
    run = tmp_path / "run"
    run.mkdir()
    (run / "flex_deepep.log").write_text(lzma.open(DATA / "megatron_flex_deepep.log.xz", "rt").read())
    (run / "flex_deepep.json").write_text('{"rc": 0, "wall_s": 66}')
    shutil.copyfile(DATA / "megatron_flex_deepep.sqlite.xz", run / "flex_deepep.sqlite.xz")
    monkeypatch.setattr(tbb, "BANK", bank)
    entries = tbb.build([run], add=True)
    names = [e["name"] for e in entries]
    assert set(names) == {e["name"] for e in before} | {"flex_deepep"}
    new = entries[names.index("flex_deepep")]
    assert new["state"] == "COMPLETED" and new["trace"] == "traces/flex_deepep.sqlite.xz"
    assert new["analysis"]["metrics"]["combined"]["kernel_class_count"]["deepep"] > 0
    assert (bank / new["trace"]).exists() and (bank / new["log"]).exists()
    # an entry whose trace was dropped keeps its recorded analysis; one with a trace is re-analysed
    old = {e["name"]: e for e in before}
    dropped = next(e for e in entries if e["name"] in tbb.TRACE_DROPPED and e["name"] in old)
    assert dropped["analysis"] == old[dropped["name"]]["analysis"]
    base = entries[names.index("baseline")]
    assert base["analysis"]["metrics"]["combined"]["a2a_wait_ms"] > 0
