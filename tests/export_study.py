"""A small study written straight into a store, the way the tuner records one, for the tests of
`moetune export` (tests/report/test_export.py, tests/cli/test_export.py): no job runs.

    1 baseline (moe_proxy's), judged 400 ms, kept
    └ 2 larger_micro_batch: micro_batch 2 -> 4, 400 -> 300 ms, kept
      ├ 3 ep_a2a_overlap: overlap_ep_a2a on, 300 -> 250 ms, kept (the best)
      ├ 4 recompute_full: full recompute, 300 -> 360 ms, reverted
      └ 5 manual_gc: failed, never judged
"""
from __future__ import annotations

from pathlib import Path

from moetune.experiment.schema import load_experiment
from moetune.store import Store

EXPERIMENT = Path(__file__).resolve().parents[1] / "experiments" / "moe_proxy.yaml"
STUDY = "exp-study"
SOURCES = {"larger_micro_batch": "moe-optimization-workflow.md", "ep_a2a_overlap": "megatron-core-moe-readme.md",
           "recompute_full": "megatron-core-moe-readme.md", "manual_gc": "moe-optimization-workflow.md"}


def build(folder: Path, force_balance: bool = False) -> tuple[str, Store]:
    """(the store's URL, the store) holding STUDY as drawn above."""
    exp = load_experiment(EXPERIMENT)
    url = f"sqlite:///{folder / 'db.sqlite'}"
    store = Store(url)
    base = exp.baseline.replace(force_balance=force_balance)
    record = {**exp.to_stored(), "baseline": base.to_dict()}
    study = store.create_study(STUDY, exp.model.name, record)
    configs = {1: base}
    configs[2] = base.replace(micro_batch=4)
    configs[3] = configs[2].replace(overlap_ep_a2a=True)
    configs[4] = configs[2].replace(recompute_granularity="full", recompute_num_layers=1)
    configs[5] = configs[2].replace(manual_gc=True)
    tree = {2: (1, "larger_micro_batch", 300.0, "keep"), 3: (2, "ep_a2a_overlap", 250.0, "keep"),
            4: (2, "recompute_full", 360.0, "revert"), 5: (2, "manual_gc", None, "failed")}
    ids, judged = {}, {1: 400.0}
    t = store.add_trial(study.id, base.to_dict(), base.config_hash())
    ids[1] = t.id
    store.update_trial(t.id, state="completed", step_time_ms=410.0)
    store.set_metrics(t.id, {"judged_step_time_ms": 400.0})
    store.add_decision(study.id, "keep", "baseline", trial_id=t.id, evidence={"state": "completed"})
    for n, (parent, fix, ms, verdict) in tree.items():
        cfg = configs[n]
        t = store.add_trial(study.id, cfg.to_dict(), cfg.config_hash(), parent_id=ids[parent], fix=fix)
        ids[n] = t.id
        change = configs[parent].diff(cfg)
        store.add_decision(study.id, "apply", f"{fix}: the wall it answers", trial_id=t.id, rule=fix,
                           evidence={"change": {k: list(v) for k, v in change.items()}, "source": SOURCES[fix]})
        if ms is None:
            store.update_trial(t.id, state="failed")
            store.add_decision(study.id, "stage_error", "the job failed", trial_id=t.id)
            continue
        judged[n] = ms
        store.update_trial(t.id, state="completed", step_time_ms=ms + 5)
        store.set_metrics(t.id, {"judged_step_time_ms": ms})
        store.add_decision(study.id, verdict, f"{judged[parent]} -> {ms} ms", trial_id=t.id,
                           evidence={"parent_step_time_ms": judged[parent], "step_time_ms": ms,
                                     "p_faster": 0.01 if verdict == "keep" else 0.9})
    return url, store
