"""The tuning loop on the trial bank: does it reach the bank's best step time with at most a third
of the bank's trials?

    .venv/bin/python benchmarks/tuning.py [--bank data/trial_bank] [--experiment moe_proxy] [--no-docs]

Runs `tune(EXPERIMENT, executor='replay')` into a fresh store (every stage real; the job step
replays the bank), then compares with the full sweep: every bank entry with the baseline's
workload (same sequence length and global batch, so the same tokens per step) on the baseline's
layer spec (local or Transformer Engine: the image decides which the tuner can reach). Without a
bank in the checkout it runs on the CPU stand-in bank (tests/standin_bank.py) and says so.
Writes benchmarks/results/tuning.json and the `## Tuning loop on the trial bank` section of
docs/benchmarks.md; for another experiment, tuning_EXPERIMENT.json and a section of its own
(`moe_proxy_te`: the same proxy on the image with Transformer Engine, DeepEP and HybridEP).
"""
from __future__ import annotations

import argparse
import json
import lzma
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import checkout  # noqa: E402,F401  (moetune from this checkout)

from moetune.decide import judge
from moetune.tune import loop as tuner  # noqa: E402
from moetune.experiment.config import TrainingConfig  # noqa: E402
from moetune.job.replay import entry_hash, load_bank  # noqa: E402
from moetune.store import Store  # noqa: E402

SECTION = "## Tuning loop on the trial bank"
TARGET_GAP, TARGET_SHARE = 0.03, 1 / 3


def entry_step_ms(e: dict) -> float | None:
    if e.get("state") != "COMPLETED":
        return None
    if e.get("step_time_ms"):
        return float(e["step_time_ms"])
    m = ((e.get("analysis") or {}).get("metrics") or {}).get("combined") or {}
    return m.get("step_time_ms")


def log_median_ms(bank_dir: Path, e: dict, spread: bool = False):
    """The entry's step time as the tuner judges it: median of the log's steady iterations
    (with spread=True: (median, MAD-based spread))."""
    if e.get("state") != "COMPLETED" or not e.get("log"):
        return (None, None) if spread else None
    from moetune.analysis.logs import parse_log  # reads .xz logs as they are
    j = judge.judged_step({"log": parse_log(Path(bank_dir) / e["log"])})
    if j["source"] != "log median":
        return (None, None) if spread else None
    return (j["step_time_ms"], j["step_time_std_ms"]) if spread else j["step_time_ms"]


def run(bank_dir: Path, work: Path, experiment: str = "moe_proxy") -> dict:
    # the sweep of moe_proxy; a tuning study's trials (benchmarks/one_gpu_tuning.py) are other models
    bank = [e for e in load_bank(bank_dir) if not e.get("study")]
    store = Store(str(work / "db.sqlite"))
    t0 = time.monotonic()
    s = tuner.tune(experiment, store, executor="replay", runs_root=work / "runs",
                   bank_dir=bank_dir, progress=True)
    wall_s = time.monotonic() - t0
    study = store.study(s["study"])
    tried = {t.config_hash: t for t in store.trials(study.id)}
    base = TrainingConfig.from_dict(store.trials(study.id)[0].config)
    by_hash = {}
    for e in bank:
        by_hash.setdefault(entry_hash(e), e)
    base_gpus = by_hash[base.config_hash()].get("gpus")
    sweep = []
    for e in bank:
        cfg = TrainingConfig.from_dict(e["config"]) if e.get("config") else None
        same = cfg is not None and cfg.seq_length == base.seq_length and \
            cfg.global_batch == base.global_batch and e.get("gpus") == base_gpus and \
            cfg.transformer_impl == base.transformer_impl
        h = entry_hash(e)
        sweep.append({"name": e.get("name"), "state": e.get("state"), "gpus": e.get("gpus"),
                      "step_time_ms": entry_step_ms(e), "log_median_ms": log_median_ms(bank_dir, e),
                      "log_spread_ms": log_median_ms(bank_dir, e, spread=True)[1],
                      "same_workload": same,
                      "run_by_tuner": by_hash.get(h) is e and h in tried and tried[h].state != "skipped"})
    comparable = [r for r in sweep if r["same_workload"] and r["step_time_ms"]]
    best = min(comparable, key=lambda r: r["step_time_ms"])
    best_med = min((r for r in comparable if r["log_median_ms"]), key=lambda r: r["log_median_ms"],
                   default=None)
    best_entry = by_hash.get(s["best_config_hash"])
    tuned_ms = entry_step_ms(best_entry) if best_entry else None
    tuned_med = log_median_ms(bank_dir, best_entry) if best_entry else None
    gap = (tuned_ms / best["step_time_ms"] - 1) if tuned_ms else None
    gap_med = (tuned_med / best_med["log_median_ms"] - 1) if tuned_med and best_med else None
    share = s["trials"] / len(bank)
    return {
        "bank": str(bank_dir), "stand_in": any(e.get("stand_in") for e in bank),
        "bank_trials": len(bank), "bank_best": best,
        "tuner": {"study": s["study"], "trials_run": s["trials"], "skipped_not_in_bank": s["skipped"],
                  "trials_total": s["trials_total"], "best_entry": best_entry.get("name") if best_entry else None,
                  "best_step_time_ms_bank": tuned_ms, "best_step_time_ms_trace": s["best_step_time_ms"],
                  "baseline_step_time_ms_trace": s["baseline_step_time_ms"], "kept_fixes": s["kept_fixes"],
                  "stop_reason": s["stop_reason"], "wall_s": round(wall_s, 1)},
        "bank_best_by_log_median": best_med,
        "gap_to_bank_best": round(gap, 4) if gap is not None else None,
        "gap_to_bank_best_by_log_median": round(gap_med, 4) if gap_med is not None else None,
        "tuned_log_median_ms": tuned_med,
        "trials_share": round(share, 4),
        "passes": gap is not None and gap <= TARGET_GAP and share <= TARGET_SHARE,
        "passes_by_log_median": gap_med is not None and gap_med <= TARGET_GAP and share <= TARGET_SHARE,
        "sweep": sweep,
    }


def section(r: dict, title: str = SECTION) -> str:
    t = r["tuner"]
    kind = ("the CPU stand-in bank (tests/standin_bank.py: made-up step times, hand-built traces; "
            "not GPU measurements)" if r["stand_in"] else "the recorded GPU trial bank")
    lines = [title, "",
             f"`.venv/bin/python benchmarks/tuning.py{r.get('command_args', '')}` on {kind}, `{r['bank']}` "
             f"({r['bank_trials']} trials). Results: `benchmarks/results/"
             f"{r.get('results_file', 'tuning.json')}`.", "",
             f"- Tuner: {t['trials_run']} trials run ({r['trials_share']:.0%} of the bank; target at most "
             f"{TARGET_SHARE:.0%}), {t['skipped_not_in_bank']} proposed configs not in the bank (recorded as "
             f"skipped, not run), {t['wall_s']} s wall.",
             f"- Best found: `{t['best_entry']}` at {t['best_step_time_ms_bank']} ms/step (bank's figure); "
             f"the bank's best of the same workload: `{r['bank_best']['name']}` at "
             f"{r['bank_best']['step_time_ms']} ms/step. Gap {100 * (r['gap_to_bank_best'] or 0):.1f}% "
             f"(target at most {TARGET_GAP:.0%}): **{'met' if r['passes'] else 'not met'}**.",
             f"- The same comparison by the median of each log's steady iterations (what the tuner "
             f"judges by; robust to the stalls of short profiled runs): tuned "
             f"{r['tuned_log_median_ms']} ms vs the bank's best "
             f"`{(r['bank_best_by_log_median'] or {}).get('name')}` "
             f"{(r['bank_best_by_log_median'] or {}).get('log_median_ms')} ms, gap "
             f"{100 * (r['gap_to_bank_best_by_log_median'] or 0):.1f}%: "
             f"**{'met' if r['passes_by_log_median'] else 'not met'}**.",
             f"- Path: baseline → {' → '.join(t['kept_fixes']) or '(nothing kept)'}; stopped: "
             f"{t['stop_reason']}."]
    if r.get("note"):
        lines.append(f"- {r['note']}")
    si = r.get("stand_in_run")
    if si:
        lines.append(f"- On the CPU stand-in bank (tests/standin_bank.py, made-up step times) the same "
                     f"loop ran {si['tuner']['trials_run']} of {si['bank_trials']} trials and reached "
                     f"`{si['tuner']['best_entry']}`, {100 * (si['gap_to_bank_best'] or 0):.1f}% from the "
                     f"stand-in's best (`{si['bank_best']['name']}`).")
    lines += ["",
             "Full sweep (every bank entry; only those with the baseline's sequence length, global "
             "batch, GPU count and layer spec compete). `step ms`: the bank's figure (mean of the profiled NVTX "
             "steps); `log median`: median of the log's steady iterations, `spread`: their median "
             "absolute deviation x 1.4826. Where the fastest entries differ by less than their "
             "spread, which one is \"the best\" is noise.", "",
             "| entry | state | GPUs | step ms | log median ms | spread ms | same workload | run by the tuner |",
             "|---|---|---|---|---|---|---|---|"]
    for row in sorted(r["sweep"], key=lambda x: (x["step_time_ms"] is None, x["step_time_ms"] or 0)):
        lines.append(f"| {row['name']} | {row['state']} | {row.get('gpus') or '–'} | "
                     f"{row['step_time_ms'] or '–'} | {row['log_median_ms'] or '–'} | "
                     f"{row.get('log_spread_ms') or '–'} | "
                     f"{'yes' if row['same_workload'] else 'no'} | {'yes' if row['run_by_tuner'] else ''} |")
    return "\n".join(lines) + "\n"


def write_section(doc: Path, text: str, section: str = SECTION) -> None:
    """Replace the `## ...` section titled `section` (up to the next `## `) with `text`; a section
    not there yet is added at the end."""
    src = doc.read_text()
    if section not in src:
        doc.write_text(src.rstrip("\n") + "\n\n" + text)
        return
    start = src.index(section)
    nxt = src.find("\n## ", start + len(section))
    end = len(src) if nxt < 0 else nxt + 1
    doc.write_text(src[:start] + text + ("\n" if nxt >= 0 else "") + src[end:])


def xz_copy(src: Path, dst: Path) -> None:
    """src as dst, xz-compressed (a source already .xz is copied as it is)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.name.endswith(".xz"):
        shutil.copyfile(src, dst)
        return
    with open(src, "rb") as f, lzma.open(dst, "wb", preset=9) as out:
        shutil.copyfileobj(f, out)


def publish(results_name: str, r: dict, text: str, section: str, docs: bool) -> None:
    """Write benchmarks/results/RESULTS_NAME and, with `docs`, the section of docs/benchmarks.md."""
    out = REPO / "benchmarks" / "results" / results_name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(r, indent=1, default=str) + "\n")
    if docs:
        write_section(REPO / "docs" / "benchmarks.md", text, section)
    print(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bank", default=str(REPO / "data" / "trial_bank"))
    p.add_argument("--experiment", default="moe_proxy")
    p.add_argument("--no-docs", action="store_true", help="do not rewrite docs/benchmarks.md")
    args = p.parse_args(argv)
    bank = Path(args.bank)
    if args.experiment != "moe_proxy":
        return _other_experiment(bank, args.experiment, not args.no_docs)
    sys.path.insert(0, str(REPO / "tests"))
    import standin_bank
    with tempfile.TemporaryDirectory(prefix="moetune-tuning-") as tmp:
        work = Path(tmp)
        standin_bank.build(work / "standin_bank")
        stand_in = run(work / "standin_bank", work / "standin_study")
        stand_in["bank"] = "CPU stand-in (tests/standin_bank.py)"
        if (bank / "bank.jsonl").exists():
            r = run(bank, work / "study")
            r["bank"] = str(bank.relative_to(REPO)) if bank.is_relative_to(REPO) else str(bank)
            r["stand_in_run"] = {k: v for k, v in stand_in.items() if k != "sweep"}
        else:
            print(f"{bank}/bank.jsonl not found: the CPU stand-in bank only", file=sys.stderr)
            r = stand_in
    publish("tuning.json", r, section(r), SECTION, not args.no_docs)
    return 0 if r["passes"] else 1


NOTES = {
    "moe_proxy_te": "Not proposed: HybridEP (`te_gg_hybridep`, the fastest by the trace, slower than "
                    "`te_gg_graphs` by the log median: 341.3 ± 16.5 against 297.7 ± 13.6 ms, from "
                    "different calls of the lease). The dispatcher rules follow the guidance "
                    "(HybridEP for NVL72 or cross-node EP, on the communication wall); here EP=2 sits "
                    "in one node and the wall is host overhead. The other host-overhead fixes "
                    "(micro batch 4, manual GC, permute and cross-entropy fusion) and FP8 after "
                    "graphs are not in the bank, so the replay skips them.",
}


def _other_experiment(bank: Path, experiment: str, docs: bool) -> int:
    """The replay for another experiment on the recorded bank, with a section of its own."""
    title = f"{SECTION}: {experiment}"
    with tempfile.TemporaryDirectory(prefix="moetune-tuning-") as tmp:
        r = run(bank, Path(tmp) / "study", experiment)
    r["bank"] = str(bank.relative_to(REPO)) if bank.is_relative_to(REPO) else str(bank)
    r["command_args"] = f" --experiment {experiment}"
    r["results_file"] = f"tuning_{experiment}.json"
    r["note"] = NOTES.get(experiment)
    publish(r["results_file"], r, section(r, title), title, docs)
    return 0 if r["passes"] else 1


if __name__ == "__main__":
    sys.exit(main())
