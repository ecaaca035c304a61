"""Render fit entries for models the memory estimate was never calibrated on into unseen.json
(layouts.json's format, for benchmarks/device/fit.py): imported from their Hugging Face configs
(tests/data/hf_configs, written from the public model cards) by moetune's own importer, at the
layouts their publishers train them with.

    python benchmarks/fit_lease/unseen.py > benchmarks/fit_lease/unseen.json

Kimi-K2 (DeepSeek-V3's architecture, 384 experts, 61 layers) at TP2 PP16 EP64 (ETP 1) on 1024 GPUs, the
layout whose rank 0 the estimate put 24 % high; GPT-OSS-120B at NVIDIA's published layout, TP1 PP4
EP8, micro batch 4, global batch 512 on 64 GPUs (Megatron-Bridge performance summary, 25.11).

The committed unseen.json is the one measured on 2026-11-28 (unseen_results.jsonl): rendered before
the importer carried GPT-OSS's attention dropout (0.0), so its GPT-OSS ranks ran at Megatron's 0.1,
on TE's unfused attention; re-rendering now adds `--attention-dropout 0.0`."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import layouts  # noqa: E402  (also puts this checkout's moetune first on the path)

from moetune.experiment.config import TrainingConfig  # noqa: E402
from moetune.experiment.hf_import import model_from_hf, read_config  # noqa: E402
from moetune.experiment.pipeline import split_fields  # noqa: E402

HF = Path(__file__).resolve().parents[2] / "tests" / "data" / "hf_configs"
BASE = dict(distributed_optimizer=True, grouped_gemm=True, router_dtype="fp32",
            transformer_impl="transformer_engine", sequence_parallel=True)
# name, kind, config file, GPUs, layout; GPT-OSS's rank 0 also at micro batch 2, in case micro
# batch 4 does not fit one 141 GB H200 without the cluster's recompute (estimated 139 GB)
UNSEEN = (
    ("kimi_k2", "published", "kimi_k2.json", 1024, dict(tp=2, pp=16, ep=64, etp=1, micro_batch=1, global_batch=4096)),
    ("gpt_oss_120b", "published", "gpt_oss_120b.json", 64,
     dict(tp=1, pp=4, ep=8, etp=1, micro_batch=4, global_batch=512, sequence_parallel=False)),
    ("gpt_oss_120b", "mbs2", "gpt_oss_120b.json", 64,
     dict(tp=1, pp=4, ep=8, etp=1, micro_batch=2, global_batch=512, sequence_parallel=False)),
)


def unseen() -> list[dict]:
    out = []
    for name, kind, file, world, layout in UNSEEN:
        model = model_from_hf(read_config(HF / file), name)
        cfg = TrainingConfig(**{**BASE, **layout})
        cfg = cfg.replace(**split_fields(model.num_layers, cfg.pp, cfg.vpp))
        out += layouts.entries(name, kind, model, cfg, world, "H100")
    # rank 0 first: the ranks the estimate was 24 % high on, and the heaviest
    return sorted(out, key=lambda e: (e["rank"] > 0, e["kind"] != "published"))


if __name__ == "__main__":
    json.dump(unseen(), sys.stdout, indent=1)
    print()
