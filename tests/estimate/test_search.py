"""estimate/search.py: what bounds a search where no layout can run."""
from __future__ import annotations

from moetune.estimate.search import batch_bound
from moetune.experiment.schema import load_experiment


def test_the_global_batch_bounds_the_gpus_it_can_feed():
    """qwen3_30b_a3b's global batch 1024 at micro batch 1 feeds 1024 data-parallel ranks: up to
    8x32 model-parallel GPUs each (the search's largest TP and PP), 262144 GPUs; past that the bound
    names the batch, within it there is none."""
    exp = load_experiment("qwen3_30b_a3b")
    assert exp.baseline.global_batch == 1024 and exp.baseline.micro_batch == 1 and exp.baseline.cp == 1
    assert batch_bound(exp, 262144) is None and batch_bound(exp, 64) is None
    why = batch_bound(exp, 262145)
    assert why is not None and "global_batch 1024" in why and "at most 1024 data-parallel ranks, 262144 GPUs" in why
    assert "a global batch of 1025 or more" in why
