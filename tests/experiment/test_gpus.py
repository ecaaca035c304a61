"""experiment/gpus.py, the one GPU table: the memory CUDA reports for each type (NVIDIA's data sheets),
its generation and its reference node's CPUs per GPU; an unknown type has none of them."""
import pytest

from moetune.experiment.gpus import GPU_TYPES, GPUS, cpus_per_gpu, generation, memory_gb


@pytest.mark.parametrize("gpu, gb, gen", [("H100", 80.0, "hopper"), ("H200", 141.0, "hopper"),
                                          ("A100", 80.0, "ampere"), ("B200", 180.0, "blackwell")])
def test_published_memory_and_generation(gpu, gb, gen):
    """The data-sheet capacities and architectures of the GPUs the tests and the device runs use."""
    assert memory_gb(gpu) == gb and generation(gpu) == gen


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
