"""experiment/gpus.py, the one GPU table: the memory CUDA reports for each type (GiB; measured where
moetune measured it, else the data sheet's), its generation and its reference node's CPUs per GPU;
an unknown type has none of them."""
import re
from pathlib import Path

import pytest

from moetune.experiment.gpus import GPU_TYPES, GPUS, MEMORY_SOURCES, cpus_per_gpu, generation, memory_gb, stand_ins

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("gpu, gb, gen", [("H100", 79.18, "hopper"), ("H200", 139.80, "hopper"),
                                          ("A100", 80.0, "ampere"), ("B200", 178.35, "blackwell")])
def test_memory_and_generation(gpu, gb, gen):
    """The capacities and architectures of the GPUs the tests and the device runs use."""
    assert memory_gb(gpu) == gb and generation(gpu) == gen


@pytest.mark.parametrize("gpu, record", [
    ("H100", "benchmarks/one_gpu_tuning/runs/9/analysis.json"),  # a Qwen3-235B one-GPU trial's OOM
    ("H200", "tests/data/gpu/oom.log"),  # a one-GPU trial's OOM on the lent H200
])
def test_measured_capacity_is_what_cuda_reported_on_the_lent_machine(gpu, record):
    """The H100's and H200's figures are the total capacity PyTorch's out-of-memory line printed on
    moetune's own runs (GiB, the estimate's unit), not the data sheet's 80 and 141 GB."""
    text = (ROOT / record).read_text()
    (cap,) = set(re.findall(r"total capacity of ([0-9.]+) GiB", text))
    assert memory_gb(gpu) == float(cap) < {"H100": 80.0, "H200": 141.0}[gpu]
    assert MEMORY_SOURCES[gpu].startswith("measured by moetune")


def test_cpus_per_gpu_is_the_reference_nodes_threads_over_its_gpus():
    """DGX H100: 2 x 56 cores, 2 threads each, over 8 GPUs is 28; DGX A100: 2 x 64 x 2 / 8 is 32."""
    assert cpus_per_gpu("H100") == 2 * 56 * 2 // 8 == 28
    assert cpus_per_gpu("A100") == 2 * 64 * 2 // 8 == 32


def test_an_unknown_type_has_no_figures():
    """None or a type not in the table: no memory, no CPUs, the generation given as default."""
    for gpu in (None, "", "H999"):
        assert memory_gb(gpu) is None and cpus_per_gpu(gpu) is None
        assert generation(gpu) == "unknown" and generation(gpu, "hopper") == "hopper"


def test_types_are_the_tables_keys_and_every_row_is_complete():
    """GPU_TYPES lists the table in order; every row has a positive capacity, a known generation
    and CPUs."""
    assert GPU_TYPES == tuple(GPUS)
    for g in GPUS.values():
        assert g.memory_gb > 0 and g.generation in ("ampere", "hopper", "blackwell") and g.cpus_per_gpu > 0


KERNEL_KEY = ("generation", "bf16_tflops", "fp8_tflops")  # estimate/kernels.table_for
LINK_KEY = ("generation", "nvlink_gb_s")  # estimate/measured.link_table


@pytest.mark.parametrize("key", [KERNEL_KEY, LINK_KEY])
def test_h100_and_h200_stand_for_each_other_and_another_generation_does_not(key):
    """The type itself first, then the others equal on the key in the table's order; the H100 and
    H200 (one GH100 die, NVLink 4) match on both keys, the A100 and B200 on neither."""
    for a, b in (("H100", "H200"), ("H200", "H100")):
        found = stand_ins(a, *key)
        assert found[0] == a and b in found and len(set(found)) == len(found)
        assert "A100" not in found and "B200" not in found
    assert stand_ins("B200", *key)[0] == "B200" and "H200" not in stand_ins("B200", *key)


def test_stand_ins_follow_each_key():
    """The H800 (NVLink cut to 200 GB/s) stands for the H100 on the kernel key, not the link key;
    an unknown type has none; a misspelt field fails rather than matching everything."""
    assert stand_ins("H100", *KERNEL_KEY) == ["H100", "H800", "H200", "GH200"]
    assert stand_ins("H100", *LINK_KEY) == ["H100", "H200", "GH200"]
    assert stand_ins("H999", *LINK_KEY) == []
    with pytest.raises(AttributeError):
        stand_ins("H100", "nvlink")
