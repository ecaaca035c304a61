"""The one-GPU studies of the models whose baselines are deep pipelines, read back:
`moetune tune deepseek_v3 --one-gpu` and `moetune tune mixtral_8x22b --one-gpu` on one H100
(benchmarks/device/tune.sh start --one-gpu), each from its shipped YAML.

    .venv/bin/python benchmarks/one_gpu_studies.py --import STUDY=DIR ...  # DIR: the unpacked `tune`
                                                   # folder of tune.sh pack holding that study;
                                                   # copied into benchmarks/one_gpu_studies/MODEL/,
                                                   # its trials into the trial bank (the baseline's
                                                   # trace only: the bank stays small)
    .venv/bin/python benchmarks/one_gpu_studies.py [--no-docs]   # the tables, from those folders

Tables as benchmarks/one_gpu_tuning.py makes them (every decision with its evidence, the judged
baseline and best, how many steps a 5 % change needs), written to
benchmarks/results/one_gpu_studies.json and the section below of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import checkout  # noqa: E402,F401  (moetune from this checkout)

import one_gpu_tuning as tables  # noqa: E402
from moetune.store import Store  # noqa: E402
from tuning import publish  # noqa: E402

HOME = REPO / "benchmarks" / "one_gpu_studies"
STUDIES = ("deepseek_v3-1gpu", "mixtral_8x22b-1gpu")
SECTION = "## One-GPU studies of the deep pipelines"

INTRO = [
    SECTION, "",
    "`moetune tune deepseek_v3 --one-gpu` and `moetune tune mixtral_8x22b --one-gpu` from their "
    "shipped YAMLs on one H100 80GB (`nvidia-h100-x1`, 2026-11-25; megatron-core 0.19.2, Transformer "
    "Engine 2.20.2, Nsight Systems 2025.3.1; `ITERS=12 MAX_TRIALS=5` (deepseek_v3) and `MAX_TRIALS=4` "
    "(mixtral_8x22b) `bash benchmarks/device/tune.sh start --one-gpu MODEL`, then `tune.sh wait`). "
    "Each trial is one rank of the production layout (deepseek_v3 TP2 PP16 EP64 on 1024 GPUs, "
    "mixtral_8x22b's baseline PP8 on 128) alone under Megatron's fake process group, static "
    "routing, the one-GPU step the study planned before any job (32 and 16 sequences of 4096 "
    "tokens: a micro-batch for each pipeline stage in flight), fitted first (the first, the last "
    "and the most-MoE stage). Files: `benchmarks/one_gpu_studies/MODEL/` (store, reports, each "
    "trial's fit, log and analysis); the trials are in the trial bank. Tables: "
    "`.venv/bin/python benchmarks/one_gpu_studies.py`.", "",
    "What the runs showed:", "",
    "- **Both studies ran to a stop decision with reports.** deepseek_v3: the baseline, FP8 "
    "blockwise and permute fusion (both slower, reverted), a larger micro batch that the fit "
    "refused (rank 64 out of memory on one GPU), then patience. mixtral_8x22b: the baseline, a "
    "larger micro batch refused by the fit, TE CUDA graphs kept, FP8 blockwise and permute fusion "
    "within noise, then the trial budget.",
    "- **The rank that stood for the layout.** deepseek_v3: rank 960 (stage 15 of 16, 3 MoE "
    "layers; the fit measured 4.39 s a step there against 2.03 s for stage 0, which holds the 3 "
    "dense layers and no MoE layer, and 4.07 s for stage 1). mixtral_8x22b: rank 112 (stage 7 of "
    "8, 1.95 s against 1.72 s for stage 0), for every trial (the first run's fit: 2.29 s against 1.87 s).",
    "- **A first mixtral_8x22b run judged a change across ranks** (same day, same machine, "
    "kept out of the bank): each trial's own 3-iteration fit picked its rank again, and after CUDA "
    "graphs the fit placed stage 0 above stage 7 (3.48 s against 2.90 s), so trial 3 ran rank 0 "
    "and was judged against trial 1's rank 112: +23.8 % (2174.1 → 1657.6 ms), partly the stage's "
    "difference. Trials of one pipeline layout now run the rank their first trial's fit chose "
    "(trial/stages.py `pinned_rank`); rerun so, the graphs gave +13.7 % (1959.4 → 1691.1 ms, "
    "p = 0.025) on rank 112 both sides.",
    "- **The wall a one-rank trial shows is host overhead or compute, never communication**: the "
    "fake process group skips every collective, so no dispatcher or overlap rule is proposed in "
    "a one-GPU study. Those are for the cluster (issue: the communication wall on real GPUs).",
    "",
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--import", dest="src", nargs="*", default=[], metavar="STUDY=DIR")
    p.add_argument("--no-docs", action="store_true")
    a = p.parse_args(argv)
    for item in a.src:
        study, _, folder = item.partition("=")
        if study not in STUDIES or not folder:
            p.error(f"--import {item!r}: STUDY=DIR with STUDY one of {', '.join(STUDIES)}")
        run = HOME / study.removesuffix("-1gpu")
        tables.import_run(Path(folder), run, {study}, {study: {1}})
        for other in (run / "reports").glob("*"):  # a report of another study packed beside it
            if not other.name.startswith(study + "."):
                other.unlink()
    results = []
    for study in STUDIES:
        run = HOME / study.removesuffix("-1gpu")
        store = Store(str(run / "moetune.db"), read_only=True)
        results += [tables.study_rows(store, s, run) for s in store.studies() if s.name == study]
    text = "\n".join(INTRO + tables.study_tables(results))
    publish("one_gpu_studies.json", {"studies": results}, text, SECTION, not a.no_docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
