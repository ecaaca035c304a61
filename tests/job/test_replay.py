"""job/replay.py, the demo's job step, on the recorded trial bank (data/trial_bank): a
config the bank holds gets that entry's log and trace written as the training would have written
them; the same config run for another length is answered by the same entry; a config the bank does
not hold, a folder with no bank, and a malformed bank line are each one line."""
import json
import lzma
from pathlib import Path

import pytest

from moetune.job import replay
from moetune.job.replay import ReplayError

BANK = Path(__file__).resolve().parents[2] / "data" / "trial_bank"


@pytest.fixture(scope="module")
def entries():
    return {e["name"]: e for e in replay.load_bank(BANK)}


def test_a_banked_config_replays_its_log_and_trace_byte_for_byte(entries, tmp_path):
    """The baseline entry's config writes its log and trace, decompressed, and a state naming it."""
    e = entries["baseline"]
    state = replay.replay_job(replay.entry_config(e).to_dict(), str(tmp_path), str(BANK))
    assert state == {"state": "COMPLETED", "bank_entry": "baseline"}
    assert (tmp_path / "log.txt").read_bytes() == lzma.open(BANK / e["log"]).read()
    assert (tmp_path / "trace_0.sqlite").read_bytes() == lzma.open(BANK / e["trace"]).read()
    assert json.loads((tmp_path / "state.json").read_text()) == state


def test_an_entry_without_a_trace_writes_only_its_log(entries, tmp_path):
    """A recorded run kept without its trace (mbs1) replays its log and no trace file."""
    replay.replay_job(replay.entry_config(entries["mbs1"]).to_dict(), str(tmp_path), str(BANK))
    assert (tmp_path / "log.txt").exists() and not list(tmp_path.glob("trace_*"))


def test_the_same_config_run_for_another_length_finds_the_same_entry(entries):
    """Only the run length differs: the entry of the same shape answers; each entry's own config
    finds an entry of its own hash (the first of a hash wins)."""
    cfg = replay.entry_config(entries["mbs4"])
    longer = cfg.replace(train_iters=(cfg.train_iters or 10) + 7)
    assert longer.config_hash() != cfg.config_hash()
    assert replay.find(longer, BANK)["name"] == "mbs4"
    for e in entries.values():
        assert replay.entry_hash(replay.find(replay.entry_config(e), BANK)) == replay.entry_hash(e)


def test_a_config_not_in_the_bank_is_one_line(entries, tmp_path):
    """A shape no entry has fails the job with the config's hash and 'not in the trial bank'."""
    cfg = replay.entry_config(entries["baseline"]).replace(seq_length=777)
    with pytest.raises(ReplayError, match=f"config {cfg.config_hash()} is not in the trial bank") as e:
        replay.replay_job(cfg.to_dict(), str(tmp_path), str(BANK))
    assert len(str(e.value).splitlines()) == 1


def test_no_bank_and_a_malformed_bank_are_one_line(tmp_path):
    """A folder without bank.jsonl names --bank and MOETUNE_BANK; a line that is not JSON is named
    by its file and line number."""
    with pytest.raises(ReplayError, match="no trial bank here.*--bank .*MOETUNE_BANK"):
        replay.load_bank(tmp_path)
    (tmp_path / "bank.jsonl").write_text('{"name": "a", "args": []}\n\n{broken\n')
    with pytest.raises(ReplayError, match=r"bank.jsonl:3: not JSON"):
        replay.load_bank(tmp_path)
