"""estimate/kernels.py: the kernel table prices a shape as its GPU was measured to run it, the
nearest measured shape's rate otherwise, never a row the probe could not time, and stands for GPU
types it was not measured on by their tensor cores or, failing that, their data-sheet peaks."""
import pytest

from moetune.experiment import gpus
from moetune.experiment.config import TrainingConfig
from moetune.estimate import kernels

ROWS = [
    {"kind": "gemm", "dtype": "bf16", "m": 1024, "k": 1024, "n": 1024, "us": 10.0, "tflop_s": 214.7},
    {"kind": "gemm", "dtype": "bf16", "m": 128, "k": 128, "n": 128, "us": 40.0, "tflop_s": 0.1, "host_ahead": False},
    {"kind": "layer", "recipe": "bf16", "m": 1024, "k": 1024, "n": 1024, "groups": 1, "run_as": [1024, 1024, 1024],
     "fwd_us": 10.0, "bwd_us": 20.0, "host_ahead": True},
    {"kind": "layer", "recipe": "tensorwise", "m": 1024, "k": 1024, "n": 1024, "groups": 1,
     "run_as": [1024, 1024, 1024], "fwd_us": 9.0, "bwd_us": 15.0, "host_ahead": True},
    # padded to the block: measured as 128 x 1024 x 1024 and priced at that rate elsewhere
    {"kind": "layer", "recipe": "tensorwise", "m": 100, "k": 1024, "n": 1024, "groups": 4, "run_as": [128, 1024, 1024],
     "fwd_us": 8.0, "bwd_us": 16.0, "host_ahead": True},
    # the host fell behind the GPU: its time holds the host's gaps, not a rate
    {"kind": "layer", "recipe": "tensorwise", "m": 4096, "k": 1024, "n": 1024, "groups": 1,
     "run_as": [4096, 1024, 1024], "fwd_us": 900.0, "bwd_us": 900.0, "host_ahead": False},
]


def test_a_layer_is_priced_as_measured_else_at_its_nearest_shapes_rate():
    """A measured shape takes its forward and backward time; another shape the nearest measured
    one's rate (over the FLOPs it ran, padding in) at its own FLOPs; a row the host did not run
    ahead of (layer or GEMM) is not read; a recipe without rows gives None (the GEMM rows price it)."""
    t = kernels.KernelTable({"rows": ROWS}, "test")
    assert t.layer_us(1024, 1024, 1024, 1, "bf16") == 30.0
    assert t.layer_us(100, 1024, 1024, 4, "tensorwise") == 24.0
    rate = 6 * 1024 ** 3 / 24.0  # FLOPs a µs of the nearest row (1024 cubed: 4096 x 1024 x 1024 left out)
    assert t.layer_us(4096, 1024, 1024, 1, "tensorwise") == pytest.approx(6 * 4096 * 1024 * 1024 / rate)
    assert t.layer_us(1024, 1024, 1024, 1, "blockwise") is None
    assert t.gemm_tflops(128, 128, 128) == 214.7  # the host-bound row left out: the nearest measured one


def test_recipes_map_to_the_rows_that_price_them():
    """BF16 its rows; blockwise its own; current scaling, delayed scaling (Megatron's default) and
    MXFP8 the tensorwise rows."""
    c = TrainingConfig()
    assert kernels.recipe_rows(c) == "bf16"
    assert kernels.recipe_rows(c.replace(fp8_format="e4m3", fp8_recipe="blockwise")) == "blockwise"
    for recipe in (None, "delayed", "tensorwise", "mxfp8"):
        assert kernels.recipe_rows(c.replace(fp8_format="e4m3", fp8_recipe=recipe)) == "tensorwise"


def test_the_shipped_table_has_every_recipe_and_no_rate_above_the_peak():
    """H200.json: layer rows of the four recipes, attention up to 32k tokens; no GEMM, layer or
    attention rate above the H200's data-sheet peak of its precision."""
    t = kernels.shipped("H200")
    g = gpus.GPUS["H200"]
    assert set(t.layers) == set(kernels.RECIPES)
    assert max(k[1] for k in t.attention) >= 32768
    assert max(max(v.values()) for v in t.gemms.values()) < g.fp8_tflops
    assert max(t.gemms["bf16"].values()) < g.bf16_tflops
    for recipe, rows in t.layers.items():
        peak = g.bf16_tflops if recipe == "bf16" else g.fp8_tflops
        assert max(flop / us / 1e6 for us, flop in rows.values()) < peak, recipe


def test_a_gpu_type_stands_in_by_tensor_cores_else_by_its_peaks():
    """The H100 reads the H200's table as measured (the same die); the B200, of another generation,
    reads it at its data-sheet peaks over the H200's, BF16 and FP8 apart, and says so; a type outside
    the GPU table is refused with the valid ones."""
    h200, h100, b200 = kernels.table_for("H200"), kernels.table_for("H100"), kernels.table_for("B200")
    assert h100.layer_us(4096, 4096, 3072, 1, "bf16") == h200.layer_us(4096, 4096, 3072, 1, "bf16")
    bf, f8 = 2250 / 989, 4500 / 1979
    assert b200.layer_us(4096, 4096, 3072, 1, "bf16") == pytest.approx(h200.layer_us(4096, 4096, 3072, 1, "bf16") / bf)
    assert b200.layer_us(4096, 4096, 3072, 1, "tensorwise") == pytest.approx(
        h200.layer_us(4096, 4096, 3072, 1, "tensorwise") / f8)
    assert b200.gemm_tflops(4096, 4096, 3072) == pytest.approx(h200.gemm_tflops(4096, 4096, 3072) * bf)
    assert "no B200 measured" in b200.source and "standing for the H100" in h100.source
    with pytest.raises(ValueError, match="give one of A100"):
        kernels.table_for("Z9")
