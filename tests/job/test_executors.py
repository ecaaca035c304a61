"""job/executors.py, the registry of executor kinds: an unknown kind is one line naming the valid
ones; auto is Slurm by slurm.available's rule; the demo's replay refuses a config the bank does not
hold and submits the bank's recording as a local job, whose reference reads as any local job's."""
from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest

from moetune.job import executors, render, replay, scheduler, slurm
from tests.conftest import stand_in_cluster

BANK = Path(__file__).resolve().parents[2] / "data" / "trial_bank"


def test_the_registry_holds_the_three_kinds():
    assert list(executors.KINDS) == ["slurm", "local", "replay"]
    assert all(executors.KINDS[k].kind == k for k in executors.KINDS)


def test_an_unknown_kind_is_one_line_naming_the_valid_ones():
    with pytest.raises(executors.JobError) as e:
        executors.get("docker")
    assert str(e.value) == "executor 'docker': use one of auto, slurm, local, replay"


def test_auto_follows_the_one_rule(monkeypatch):
    monkeypatch.setattr(slurm, "available", lambda: False)
    assert executors.resolve("auto") == "local"
    with pytest.raises(executors.JobError, match="sbatch/sacct not on PATH"):
        executors.get("slurm")
    monkeypatch.setattr(slurm, "available", lambda: True)
    assert executors.resolve("auto") == "slurm" and isinstance(executors.get("auto"), executors.SlurmExecutor)


def test_replay_refuses_what_the_bank_does_not_hold():
    base = replay.entry_config(replay.load_bank(BANK)[0])
    ex = executors.get("replay", bank_dir=BANK)
    assert ex.refuses(base) is None
    assert "not in the trial bank" in ex.refuses(base.replace(seq_length=777))
    assert executors.get("local").refuses(base.replace(seq_length=777)) is None


def test_the_tuner_asks_the_executor_what_to_propose_and_whether_jobs_run():
    """The replay runs no job (nothing to probe or fit first) and proposes only what the bank
    holds; the others run jobs and pass over no config."""
    base = replay.entry_config(replay.load_bank(BANK)[0])
    other = base.replace(seq_length=777)
    ex = executors.of_kind("replay", bank_dir=BANK)
    assert ex.runs_jobs is False and ex.not_proposed(base) is None
    assert ex.not_proposed(other) == (f"the trial bank holds no recorded run of its config {other.config_hash()}; "
                                      "the demo proposes only what it can replay")
    for kind in ("slurm", "local", "auto"):  # of_kind checks no Slurm: the tuner resolved it before
        ex = executors.of_kind(kind)
        assert ex.runs_jobs is True and ex.not_proposed(other) is None


def test_replay_submits_the_recording_as_a_local_job(tmp_path):
    """The rendered job's config.json names the trial; the job writes the bank entry's log."""
    entry = replay.load_bank(BANK)[0]
    config = replay.entry_config(entry).to_dict()
    spec = render.job_spec(name="replayed", folder=tmp_path / "trial", config=config,
                           argv=["--train-iters", "4"], cluster=stand_in_cluster(), launcher="local")
    render.write_job(spec)
    spec.paths.config.write_text(json.dumps(config))
    ref = executors.get("replay", bank_dir=BANK).submit(spec)
    assert ref.kind == "local" and ref.name == "replayed" and ref.folder == str(spec.paths.submitit)
    assert scheduler.wait(ref, poll_s=0.2, timeout_s=120).state == "COMPLETED"
    assert spec.paths.log.read_bytes() == lzma.open(BANK / entry["log"]).read()
