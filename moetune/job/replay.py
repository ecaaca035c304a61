"""The demo's job step: replay a recorded GPU trial instead of training.

`replay_job(config, folder, bank_dir)` runs where a training job would (a submitit job): it finds
the trial bank entry whose TrainingConfig hash equals the trial's and writes that entry's log
(`log.txt`) and trace (`trace_0.sqlite`) into the trial folder, as the training would have.
A config the bank does not hold (`not_in_bank`) is not submitted: the trial's outcome is
`skipped`, and the tuner records it so.
"""
from __future__ import annotations

import json
import lzma
import shutil
from functools import lru_cache
from pathlib import Path

from moetune import settings
from moetune.errors import MoetuneError
from moetune.experiment.config import TrainingConfig
from moetune.job.paths import TrialPaths
from moetune.paths import write_whole


class ReplayError(MoetuneError):
    """The trial bank cannot answer this job (one line)."""


def entry_config(entry: dict) -> TrainingConfig:
    if entry.get("config"):
        return TrainingConfig.from_dict(entry["config"])
    return TrainingConfig.from_args(list(entry["args"]))


def entry_hash(entry: dict) -> str:
    return entry_config(entry).config_hash()


def load_bank(bank_dir: str | Path | None = None) -> list[dict]:
    """The bank's entries (`bank_dir` None: settings.bank(), a checkout's own unless MOETUNE_BANK)."""
    path = Path(bank_dir or settings.bank()) / "bank.jsonl"
    if not path.exists():
        raise ReplayError(f"{path}: no trial bank here; the demo replays a checkout's data/trial_bank "
                          "(54 MiB, not in the wheel): give --bank CHECKOUT/data/trial_bank or set "
                          "MOETUNE_BANK")
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ReplayError(f"{path}:{n}: not JSON ({e.msg})") from None
    return out


# How long a run was and which steps it profiled: a recorded run of the same config with another
# length answers for it (a one-GPU study ran 12 iterations, its experiment says 20)
RUN_LENGTH = {"train_iters": 0, "profile_step_start": 0, "profile_step_end": 0}


def shape_hash(config: TrainingConfig) -> str:
    return config.replace(**RUN_LENGTH).config_hash()


@lru_cache(maxsize=8)
def _indexes(bank_dir: str, mtime: float) -> tuple[dict[str, dict], dict[str, dict]]:
    """({config hash: entry}, {shape hash: entry}); the first entry of a hash wins."""
    by_hash, by_shape = {}, {}
    for e in load_bank(bank_dir):
        cfg = entry_config(e)
        by_hash.setdefault(cfg.config_hash(), e)
        by_shape.setdefault(shape_hash(cfg), e)
    return by_hash, by_shape


def _cached(bank_dir: str | Path) -> tuple[dict[str, dict], dict[str, dict]]:
    p = Path(bank_dir)
    return _indexes(str(p), (p / "bank.jsonl").stat().st_mtime if (p / "bank.jsonl").exists() else 0)


def find(config: TrainingConfig, bank_dir: str | Path | None = None) -> dict | None:
    """The entry of this config; else one of the same config run for another length."""
    by_hash, by_shape = _cached(bank_dir or settings.bank())
    return by_hash.get(config.config_hash()) or by_shape.get(shape_hash(config))


def _copy(src: Path, dst: Path) -> None:
    if src.suffix == ".xz":
        with lzma.open(src) as f, open(dst, "wb") as out:
            shutil.copyfileobj(f, out)
    else:
        shutil.copyfile(src, dst)


def not_in_bank(config: TrainingConfig, bank_dir: str | Path | None = None) -> str | None:
    """Why the bank cannot replay this config (the trial is skipped, nothing submitted); None
    where it can."""
    bank_dir = bank_dir or settings.bank()
    if find(config, bank_dir) is not None:
        return None
    return (f"config {config.config_hash()} is not in the trial bank ({bank_dir}); "
            "the demo can only replay recorded trials")


def replay_job(config: dict, folder: str, bank_dir: str | None = None) -> dict:
    """The job body: write the matching entry's log and trace into `folder`."""
    bank_dir = bank_dir or str(settings.bank())
    cfg = TrainingConfig.from_dict(config)
    missing = not_in_bank(cfg, bank_dir)
    if missing:
        raise ReplayError(missing)
    entry = find(cfg, bank_dir)
    out, bank = TrialPaths(folder), Path(bank_dir)
    out.folder.mkdir(parents=True, exist_ok=True)
    if entry.get("log"):
        _copy(bank / entry["log"], out.log)
    traces = entry.get("trace") or []
    for i, rel in enumerate([traces] if isinstance(traces, str) else traces):
        kind = out.report if rel.removesuffix(".xz").endswith(".nsys-rep") else out.sqlite
        _copy(bank / rel, kind(i))
    state = {"state": entry.get("state"), "bank_entry": entry.get("name")}
    write_whole(out.state, json.dumps(state))
    return state
